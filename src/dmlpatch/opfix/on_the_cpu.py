"""A fix kernel's own CPU fallback, for the calls it leaves to the CPU (a matrix wider than
its limit, a mode it does not compose): what DirectML's fallback would do, said and counted
as DirectML's is."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_map

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix.cpu_ops import cpu_kernel


def through_the_cpu(name: str, op: Any, arguments: tuple[Any, ...], **options: Any) -> Any:
    """What DirectML's fallback does, done by a fix kernel itself for the calls it leaves
    (a matrix wider than its limit): ``op`` (an overload, or a packet's default) on CPU
    copies, the results back, said at the program's line and counted as the fallback ``name``
    (its copies, and its CPU compute in the run's account). (Passing the call on to the
    ``.out`` kernel would go through DirectML's fallback, which loses the resize of an
    ``out=`` tensor: microsoft/DirectML#431.) A call on empty tensors whose results are
    empty too (an empty batch: no detections, no matches) has nothing to compute or copy:
    its results are made on the device, and it is counted as fixed."""
    from dmlpatch.placement import fallbacks

    overload = op.default if isinstance(op, torch._ops.OpOverloadPacket) else op
    empty = _empty_results(overload, arguments, options)
    if empty is not None:
        record("fixed", name)
        return empty
    fallbacks.announce(name)
    return _named_cpu_kernel(overload, name)(*arguments, **options)


def _empty_results(
    overload: torch._ops.OpOverload, arguments: tuple[Any, ...], options: dict[str, Any]
) -> Optional[Any]:
    """The results, allocated on the device, of a call whose tensors and results are all
    empty; None for any other call. (The CPU kernel runs on empty tensors, so its checks,
    shapes and errors are the CPU's.)"""
    tensors = [t for t in tree_flatten((arguments, options))[0] if isinstance(t, torch.Tensor)]
    devices = [t.device for t in tensors if t.device.type == "privateuseone"]
    if not devices or any(t.numel() for t in tensors):
        return None

    def on_the_host(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "privateuseone":
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
        return value

    results = overload(*tree_map(on_the_host, arguments), **tree_map(on_the_host, options))
    flat = [t for t in tree_flatten(results)[0] if isinstance(t, torch.Tensor)]
    if any(t.numel() for t in flat):
        return None

    def on_the_device(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.is_complex():  # held as dmlpatch holds complex tensors: made by aten::empty
            return torch.empty(value.shape, dtype=value.dtype, device=devices[0])
        return torch.empty_strided(
            value.shape, value.stride(), dtype=value.dtype, device=devices[0]
        )

    return tree_map(on_the_device, results)


@functools.cache
def _named_cpu_kernel(op: torch._ops.OpOverload, name: str) -> Callable[..., Any]:
    return cpu_kernel(op, reported=name)
