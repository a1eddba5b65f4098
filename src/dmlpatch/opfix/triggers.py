"""Fixes that wait for their trigger: nothing on the hot path until DirectML could go wrong.

Two of DirectML's wrong answers sit in the hottest operators, and only one kind of tensor
brings them out: a product with a **bool** tensor (``x * mask`` is bool, and ``x *= mask``
turns ``x`` bool, microsoft/DirectML#686, #737) and a sum over **uint8** (#619). A Python kernel
in front of every ``mul`` and ``sum`` would cost each call several microseconds (more than the
native call itself on the simulated device) for a case most programs never meet. So those
fixes are installed the moment the first tensor of their dtype comes to exist on the device:

- every tensor that arrives by a copy or an allocation is seen by kernels dmlpatch has there
  anyway (:mod:`dmlpatch.opfix.tensors.transfers`, :mod:`dmlpatch.opfix.tensors.allocation`);
- bool tensors are also made by DirectML's own comparisons and logical operators, which
  :mod:`dmlpatch.opfix.sentinels` watches until the first one appears (then those sentinels
  stand aside: they cost their operators a Python call until then).

Before the trigger, a product or sum cannot meet the dtype that breaks it, because no such
tensor exists on the device. Installing a kernel while another thread runs the same operator
is what PyTorch's own lazy registrations do too; it happens once per process.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    import torch

    from dmlpatch.opfix._kernel import Kernel

_lock = threading.Lock()
#: Kernels waiting for a dtype, by dtype.
_waiting: dict[torch.dtype, list[Kernel]] = {}
#: What installs kernels (set by :func:`dmlpatch.opfix.install`).
_install: Optional[Callable[[list[Kernel]], None]] = None
#: Called once each dtype has fired (the sentinels stand aside for bool).
_on_fire: dict[torch.dtype, list[Callable[[], None]]] = {}


def wait(
    dtype: torch.dtype, kernels: list[Kernel], install: Callable[[list[Kernel]], None]
) -> None:
    """Install ``kernels`` with ``install`` once a tensor of ``dtype`` is on the device."""
    global _install
    with _lock:
        _waiting.setdefault(dtype, []).extend(kernels)
        _install = install


def when_fired(dtype: torch.dtype, action: Callable[[], None]) -> None:
    with _lock:
        _on_fire.setdefault(dtype, []).append(action)


def waiting_for(dtype: torch.dtype) -> bool:
    return dtype in _waiting


def seen(dtype: torch.dtype) -> None:
    """A tensor of ``dtype`` is on the device now (cheap unless a fix waits for it)."""
    if dtype in _waiting:
        _fire(dtype)


def _fire(dtype: torch.dtype) -> None:
    with _lock:
        kernels = _waiting.pop(dtype, None)
        actions = _on_fire.pop(dtype, [])
        install = _install
    if kernels and install is not None:
        install(kernels)
    for action in actions:
        action()


def reset() -> None:
    """Forget every waiting fix (the fixes were uninstalled)."""
    global _install
    with _lock:
        _waiting.clear()
        _on_fire.clear()
        _install = None
