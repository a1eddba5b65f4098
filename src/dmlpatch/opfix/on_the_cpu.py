"""A fix kernel's own CPU fallback, for the calls it leaves to the CPU (a matrix wider than
its limit, a mode it does not compose): what DirectML's fallback would do, said and counted
as DirectML's is."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from dmlpatch.opfix.cpu_ops import cpu_kernel


def through_the_cpu(name: str, op: Any, arguments: tuple[Any, ...], **options: Any) -> Any:
    """What DirectML's fallback does, done by a fix kernel itself for the calls it leaves
    (a matrix wider than its limit): ``op`` (an overload, or a packet's default) on CPU
    copies, the results back, said at the program's line and counted as the fallback ``name``
    (its copies, and its CPU compute in the run's account). (Passing the call on to the
    ``.out`` kernel would go through DirectML's fallback, which loses the resize of an
    ``out=`` tensor: microsoft/DirectML#431.)"""
    from dmlpatch.placement import fallbacks

    fallbacks.announce(name)
    overload = op.default if isinstance(op, torch._ops.OpOverloadPacket) else op
    return _named_cpu_kernel(overload, name)(*arguments, **options)


@functools.cache
def _named_cpu_kernel(op: torch._ops.OpOverload, name: str) -> Callable[..., Any]:
    return cpu_kernel(op, reported=name)
