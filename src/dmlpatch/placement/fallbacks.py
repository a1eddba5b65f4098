"""Heavy operators that DirectML runs through its CPU fallback, counted where they really run.

The layer hooks of :mod:`.module_hooks` see a layer's output on the device and count its
compute there. A layer whose work is one operator DirectML lacks really ran on the CPU:
``nn.MultiheadAttention`` in eval mode calls ``_native_multi_head_attention``, which DirectML's
fallback copies to the CPU, runs there and copies back. A layer hook cannot see that.

So, in ordinary runs on DirectML (or the simulated device), each heavy operator
(:mod:`.families`) that the backend serves through its CPU fallback is served by dmlpatch's
copy of that fallback instead (:func:`dmlpatch.opfix.cpu_ops.cpu_kernel`: the same copies,
the CPU kernel, counted as a fallback call) and counted as CPU compute, with the program's line
and the operator; the heavy layer that called it takes those FLOPs off its device count.
DirectML's warning is said once per operator, at the program's line, as DirectML says it.
Operators that ``DMLPATCH_CPU_OPS`` sends to the CPU are counted the same way (unannounced:
the user asked for them).
Only these calls pay: they already cost two copies and a CPU kernel each, beside which the
Python round trip is small. ``dmlpatch check`` counts every operator itself and needs none
of this.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any, Optional

import torch
from torch import nn

from dmlpatch.placement import families, frames, ledger

#: FLOPs that fallbacks ran on the CPU inside a heavy layer's current call.
given_back: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()

_library: Optional[torch.library.Library] = None
_warned: set[str] = set()
_forced: set[str] = set()  # DMLPATCH_CPU_OPS: the user's choice, not announced


def candidates(serving: Any) -> list[torch._ops.OpOverload]:
    """The heavy ATen overloads ``serving`` says the backend's CPU fallback runs, where the
    CPU has a kernel for them (without one the fallback fails anyway)."""
    from dmlpatch.opfix import serving as how

    found = []
    for name in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = name.partition("::")
        short, _, overload = rest.partition(".")
        if namespace != "aten" or families.operator_family(short) is None:
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            continue
        packet = getattr(torch.ops.aten, short, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None and serving.of(op)[0] == how.FALLBACK:
            found.append(op)
    return found


def install() -> list[str]:
    """Serve and count the loaded backend's heavy fallbacks, and count the operators
    ``DMLPATCH_CPU_OPS`` sends to the CPU (see the module docstring); returns the names of the
    fallbacks served. Nothing when no op fixes are installed (no DirectML profile)."""
    global _library
    from dmlpatch import opfix
    from dmlpatch.opfix import cpu_ops, serving

    installed = opfix.installed()
    if _library is not None or installed is None:
        return []
    chosen = serving.for_backend(installed.backend, installed.profile)
    if chosen is None:
        return []
    library = torch.library.Library("aten", "IMPL")
    names = []
    for op in candidates(chosen):
        with warnings.catch_warnings():
            # torch 2.4 warns when a Python kernel replaces a registration for the same key.
            warnings.filterwarnings("ignore", "Warning only once for all operators")
            library.impl(op.name().split("::", 1)[1], cpu_ops.cpu_kernel(op), "PrivateUse1")
        names.append(op.name())
    _library = library
    _forced.update(installed.cpu_ops)
    cpu_ops.observe(_observe)
    return names


def uninstall() -> None:
    global _library
    from dmlpatch.opfix import cpu_ops

    cpu_ops.observe(None)
    if _library is not None:
        _library._destroy()
        _library = None
    given_back.clear()
    _forced.clear()


def _observe(name: str, args: tuple[Any, ...], result: Any) -> None:
    """A CPU kernel served ``name``: count it where it ran (accounting never breaks the
    program)."""
    short = name.partition("::")[2].split(".", 1)[0]
    family = families.operator_family(short)
    if family is None:
        return
    try:
        _count(name, short, family, args, result)
    except Exception:
        return


def _count(name: str, short: str, family: str, args: tuple[Any, ...], result: Any) -> None:
    site, layer, level, loading, building = _walk()
    if name not in _warned and name not in _forced:
        _warned.add(name)
        from dmlpatch.sim.counting import fallback_warning

        warnings.warn(fallback_warning(name), UserWarning, stacklevel=level)
    book = ledger.current()
    if book is None or book.counted != "layers":
        return
    flops = families.operator_flops(short, args, result)
    if building:
        book.add(ledger.BUILDING, flops)
    elif loading:
        book.add(ledger.LOADING, flops)
    else:
        book.add_cpu(site, family, flops, name)
    if layer is not None:
        given_back[layer] = given_back.get(layer, 0) + flops


def announce(name: str) -> None:
    """DirectML's warning for a fallback a dmlpatch kernel makes itself (a linear system larger
    than the on-device solver's), once per operator, at the program's line: DirectML never
    sees such a call, so it cannot say it."""
    if name in _warned:
        return
    _warned.add(name)
    from dmlpatch.sim.counting import fallback_warning

    frame: Any = sys._getframe(1)
    level = 2  # warnings.warn's stack level of that frame (1: this function)
    while frame is not None and frames.internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(fallback_warning(name), UserWarning, stacklevel=level if frame else 1)


def _walk() -> tuple[Optional[frames.Site], Optional[nn.Module], int, bool, bool]:
    """From the caller up: the program's line, the innermost heavy layer being called, the
    warning's stack level for that line, and whether data loading or a module's construction
    is on the way."""
    caller = frames.caller(depth=2)
    frame: Any = sys._getframe(2)
    level, found_level, layer = 2, 0, None
    while frame is not None:
        code = frame.f_code
        if not found_level and not frames.internal(code.co_filename):
            found_level = level
        if layer is None and code.co_name == "forward":
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module) and families.layer_family(type(owner)) is not None:
                layer = owner
        if found_level and layer is not None:
            break
        frame, level = frame.f_back, level + 1
    # Levels count from _walk's caller (_count), as warnings.warn counts from its caller.
    return caller.site, layer, found_level or 1, caller.loading, caller.building
