"""The terms a fix's cost functions are written in (:mod:`dmlpatch.costs.choice`): bytes of
tensors, the key a choice is remembered by, an element-wise composition, and DirectML's CPU
fallback of a call.

A module whose composition can cost more than the fallback for some shapes declares ``COSTS``
(operator -> cost function) and keeps a :class:`~dmlpatch.costs.choice.Chooser` per operator;
its kernel asks the chooser before composing and, on False, leaves the call to
:func:`~dmlpatch.opfix.on_the_cpu.through_the_cpu`. Its ``reset`` resets its choosers, so a
reinstall (or a test that sets ``DMLPATCH_DEVICE_OPS``) decides again.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from dmlpatch.costs.choice import Chooser, OnDevice, ThroughTheCpu

#: FLOPs an element-wise exp, log or sigmoid is counted as on the host, where other arithmetic
#: counts one an operation: PyTorch's vectorised CPU kernels ran them at about the rate of two
#: additions on this project's machine (silu's backward, log-sigmoid's: 0.5 ns an element).
TRANSCENDENTAL = 2


def nbytes(*tensors: Optional[torch.Tensor]) -> int:
    """The bytes of the given tensors' elements (None counts nothing)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def shapes(*tensors: Optional[torch.Tensor]) -> tuple[Any, ...]:
    """A key of the tensors' shapes and dtypes (None for a missing one)."""
    return tuple(None if t is None else (tuple(t.shape), t.dtype) for t in tensors)


def elementwise(launches: int, elements: int, moved: float, itemsize: int = 4) -> OnDevice:
    """A composition of ``launches`` element-wise kernels over ``elements`` elements that
    together read and write ``moved`` bytes an element in float32 (counted from its code: each
    kernel's inputs and output), scaled to ``itemsize``; a FLOP per element per kernel."""
    return OnDevice(launches, 0, elements * moved * itemsize / 4, float(elements * launches))


def fallback(*arguments: Any, up: float, host_flops: float = 0.0) -> ThroughTheCpu:
    """DirectML's fallback of a call with these arguments: each distinct device tensor among
    them copied down (a read-back each), ``up`` bytes of results copied back, ``host_flops`` of
    CPU work (others than device tensors are ignored)."""
    seen: dict[int, torch.Tensor] = {}
    for value in arguments:
        if isinstance(value, torch.Tensor) and value.device.type == "privateuseone":
            seen.setdefault(id(value), value)
    return ThroughTheCpu(
        down_bytes=nbytes(*seen.values()),
        up_bytes=up,
        arguments=len(seen),
        host_flops=host_flops,
    )


def resetting(*choosers: Chooser) -> Callable[[], None]:
    """A module's ``reset``: its choosers forget their answers."""

    def reset() -> None:
        for chooser in choosers:
            chooser.reset()

    return reset
