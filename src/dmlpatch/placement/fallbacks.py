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

from dmlpatch import changes, log
from dmlpatch.placement import families, frames, ledger

#: FLOPs that fallbacks ran on the CPU inside a heavy layer's current call.
given_back: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()

_libraries: dict[str, torch.library.Library] = {}
_served: set[str] = set()
_serving: Any = None
_warned: set[str] = set()
_forced: set[str] = set()  # DMLPATCH_CPU_OPS: the user's choice, not announced


def candidates(serving: Any, namespaces: Optional[set[str]] = None) -> list[Any]:
    """The operator overloads ``serving`` says the backend's CPU fallback runs, where the CPU
    has a kernel for them (without one the fallback fails anyway); ``namespaces``: only
    theirs. Views are left to the backend: a copy cannot alias its input. An overload a Python
    kernel already serves on the device is not falling back."""
    from dmlpatch.opfix import serving as how

    found = []
    # torch.library's record of Python registrations ("aten/isin.Scalar_Tensor/PrivateUse1").
    python_kernels: set[str] = getattr(torch.library, "_impls", set())
    for name in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = name.partition("::")
        if namespaces is not None and namespace not in namespaces:
            continue
        if namespace in _NOT_SERVED or not torch._C._dispatch_has_kernel_for_dispatch_key(
            name, "CPU"
        ):
            continue
        short, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace, None), short, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None or _is_view(op):
            continue
        if f"{namespace}/{rest}/PrivateUse1" in python_kernels:
            # A Python kernel of dmlpatch's serves it already (sentinels.py's watchers until
            # the first bool tensor), which torch 2.4 refuses to see replaced.
            continue
        if serving.of(op)[0] == how.FALLBACK:
            found.append(op)
    return found


#: Operator libraries whose fallbacks are not served here: the simulator's own bookkeeping.
_NOT_SERVED = frozenset({"dmlpatch_sim", "dmlpatch"})


def _is_view(op: Any) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def install() -> list[str]:
    """Serve and count the loaded backend's fallbacks, and count the operators
    ``DMLPATCH_CPU_OPS`` sends to the CPU (see the module docstring); returns the names of the
    fallbacks served. Nothing when no op fixes are installed (no DirectML profile).

    Operator libraries loaded later (torchvision's, when it is imported) are served then."""
    global _serving
    from dmlpatch.opfix import cpu_ops, serving

    installed = opfix_installed()
    if _libraries or installed is None:
        return []
    chosen = serving.for_backend(installed.backend, installed.profile)
    if chosen is None:
        return []
    _serving = chosen
    names = _serve(candidates(chosen))
    _forced.update(installed.cpu_ops)
    cpu_ops.observe(_observe)
    from dmlpatch.rewriting import hook

    for package in _LATER:
        hook.when_imported(package, _serve_package)
    changes.record(
        __name__,
        "kernels",
        f"{len(_served)} CPU fallbacks of the backend served and counted by operator",
        uninstall,
    )
    return names


#: Packages that define operator libraries of their own when imported.
_LATER = ("torchvision",)


def _serve_package(module: Any) -> None:
    if _serving is not None and _libraries:
        _serve(candidates(_serving, {module.__name__}))


def _serve(ops: list[Any]) -> list[str]:
    from dmlpatch.opfix import cpu_ops

    names = []
    for op in ops:
        namespace, _, short = op.name().partition("::")
        if op.name() in _served:
            continue
        library = _libraries.get(namespace)
        if library is None:
            library = _libraries[namespace] = torch.library.Library(namespace, "IMPL")
        with warnings.catch_warnings():
            # torch 2.4 warns when a Python kernel replaces a registration for the same key.
            warnings.filterwarnings("ignore", "Warning only once for all operators")
            reported = _serving.of(op)[1] if _serving is not None else None
            library.impl(short, cpu_ops.cpu_kernel(op, reported=reported), "PrivateUse1")
        _served.add(op.name())
        names.append(op.name())
    return names


def opfix_installed() -> Any:
    from dmlpatch import opfix

    return opfix.installed()


def uninstall() -> None:
    global _serving
    from dmlpatch.opfix import cpu_ops

    changes.forget(__name__)
    cpu_ops.observe(None)
    for library in _libraries.values():
        library._destroy()
    _libraries.clear()
    _served.clear()
    _serving = None
    given_back.clear()
    _forced.clear()


def _observe(
    name: str, args: tuple[Any, ...], result: Any, copies: int, nbytes: int, seconds: float
) -> None:
    """A CPU kernel served ``name``: count it where it ran (accounting never breaks the
    program)."""
    short = name.partition("::")[2].split(".", 1)[0]
    family = families.operator_family(short) if name.startswith("aten::") else None
    try:
        _count(name, short, family, args, result, copies, nbytes, seconds)
    except Exception as error:
        log.swallowed("the count of a CPU fallback", error)


def _count(
    name: str,
    short: str,
    family: Optional[str],
    args: tuple[Any, ...],
    result: Any,
    copies: int,
    nbytes: int,
    seconds: float,
) -> None:
    site, layer, level, loading, building = _walk()
    if name not in _warned and name not in _forced:
        from dmlpatch.sim import counting

        message = counting.fallback_warning(name)
        if site is not None:
            _warned.add(name)
            warnings.warn(message, UserWarning, stacklevel=level)
        else:  # a backward operator, on autograd's thread: no caller of its own
            from dmlpatch.placement import backward_lines

            if backward_lines.say(name, message):
                _warned.add(name)
    book = ledger.current()
    if book is None or book.counted != "layers":
        return
    if family is None:
        family, flops = families.OTHER, families.elements(args, result)
    else:
        flops = families.operator_flops(short, args, result)
    if building:
        book.add(ledger.BUILDING, flops)
    elif loading:
        book.add(ledger.LOADING, flops)
    else:
        book.add_cpu(site, family, flops, name, copies, nbytes, seconds)
    if layer is not None and family != families.OTHER:
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
