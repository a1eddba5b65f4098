"""The accounting an ordinary run keeps: one global forward hook on ``nn.Module`` calls.

Cheap enough to be on by default: for every module call the hook costs a dictionary lookup of
the module's type, and only convolution, linear, attention, normalisation and recurrent layers
go further (their output's device, a FLOP estimate from shapes). A layer that ran on the CPU
also records the line that called it, once per layer object (a layer on the device too where
an HTML report was asked for). Functional calls
(``F.linear``, ``x @ w``) are not seen here; ``dmlpatch check`` counts every operator. A layer
on the device whose operator DirectML ran through its CPU fallback gives those FLOPs back
(:mod:`.fallbacks` counts them on the CPU).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

from torch import nn
from torch._C import _get_dispatch_mode, _is_tracing, _TorchDispatchModeKey
from torch.compiler import is_compiling
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

from dmlpatch import changes
from dmlpatch.placement import fallbacks, families, frames, ledger

_UNSEEN = "unseen"
_handle: Optional[RemovableHandle] = None
# A layer's calling line is found on its first CPU call; later calls reuse it.
_callers: weakref.WeakKeyDictionary[nn.Module, frames.Caller] = weakref.WeakKeyDictionary()


def install() -> ledger.Ledger:
    """Count layer calls from now on, by the device type each one ran on."""
    global _handle
    uninstall()
    book = ledger.start("layers")
    known = families.known_layer_families()
    family_of = families.layer_family

    def after_forward(module: nn.Module, inputs: Any, output: Any) -> None:
        # Every module call of the process comes here: a dict read, then out for most.
        if is_compiling():
            # Dynamo inlines global hooks into the graph it traces: the hook must add nothing
            # to it (a lock, a dict it would guard on) or the graph breaks; compiled graphs
            # count themselves (dmlpatch.patches.torch.compiler).
            return
        family = known.get(type(module), _UNSEEN)
        if family is _UNSEEN:
            family = family_of(type(module))
        if family is None:
            return
        if _is_tracing() or _traced_by_the_compiler():
            # torch.jit.trace runs the forward once more to record it, torch 2.4's compiler
            # to trace it: not the program's compute, and shapes there are traced tensors
            # that the trace would record too.
            return
        try:
            _count(book, family, module, inputs, output)
        except Exception:
            return  # accounting never breaks the program's forward (try is cheaper than suppress)

    _handle = _module.register_module_forward_hook(after_forward)
    if _ANY_GLOBAL_HOOK is not None:
        _module._has_any_global_hook = _has_any_global_hook_but_ours
    changes.record(
        __name__,
        "callback",
        "a forward hook on every nn.Module (layer calls counted by device)",
        uninstall,
    )
    return book


_FAKE = _TorchDispatchModeKey.FAKE


def _traced_by_the_compiler() -> bool:
    """Whether torch.compile is running a layer to trace it, not to compute: torch 2.4's Dynamo
    keeps layers as calls in its graph and runs them where ``is_compiling()`` is false, three
    times a graph (its example values, AOTAutograd's functional and proxy passes), each on fake
    tensors. Torch >= 2.5 inlines the layers, so their hooks never run there."""
    return _get_dispatch_mode(_FAKE) is not None


def uninstall() -> None:
    global _handle
    changes.forget(__name__)
    if _handle is not None:
        _handle.remove()
        _handle = None
    if _ANY_GLOBAL_HOOK is not None:
        _module._has_any_global_hook = _ANY_GLOBAL_HOOK
    _callers.clear()


# torch >= 2.5 asks this before each call of a module compiled with torch.compile(module), and
# warns that global hooks fire once more for the compiled wrapper. Ours counts nothing there (a
# wrapper is no layer), so it is not one of the hooks that warning is about; nothing else in
# torch asks, and module calls read the hook dicts directly, so this costs ordinary calls nothing.
_ANY_GLOBAL_HOOK = getattr(_module, "_has_any_global_hook", None)


def _has_any_global_hook_but_ours() -> bool:
    forward = _module._global_forward_hooks
    ours = 1 if _handle is not None and _handle.id in forward else 0
    return bool(
        len(forward) > ours
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
        or getattr(_module, "_global_forward_hooks_always_called", None)
        or getattr(_module, "_global_forward_hooks_with_kwargs", None)
    )


def _count(
    book: ledger.Ledger,
    family: str,
    module: nn.Module,
    inputs: Any,
    output: Any,
) -> None:
    out = families.layer_output(output)
    if out is None:
        return
    kind = out.device.type
    if kind == "meta":  # shape-only tracing computes nothing
        return
    flops = families.layer_flops(family, module, inputs, out)
    if kind != "cpu":
        if fallbacks.given_back:
            flops = max(0, flops - fallbacks.given_back.pop(module, 0))
        if book.keeps_lines:  # the HTML report marks the line of every layer call
            book.add_device(kind, flops, _caller_of(module).site, family)
        else:
            book.add(kind, flops)
        return
    caller = _caller_of(module)
    if caller.building:
        book.add(ledger.BUILDING, flops)
    elif caller.loading:
        book.add(ledger.LOADING, flops)
    else:
        book.add_cpu(caller.site, family, flops)


def _caller_of(module: nn.Module) -> frames.Caller:
    """The line that calls ``module``, found on its first call and reused."""
    caller = _callers.get(module)
    if caller is None:
        # Frames: this function, _count, the hook, Module._call_impl, then the layer's caller.
        caller = frames.caller(depth=3)
        if not caller.building:  # a layer probed while built may later run for real
            _callers[module] = caller
    return caller
