"""``dmlpatch check --verify``: run each device operator on the CPU too and compare.

Writes of single elements of DirectML tensors have been reported to silently not happen; such
bugs corrupt results without an error. The shadow is a dispatch mode that, for every operator
call on the device, copies the call's inputs to the CPU *before* the call, runs the operator on
both, and compares the device's outputs and written arguments with the CPU's. Each operator
is checked on the device's own inputs, so one divergence does not cascade into every later
operator; the first one found is kept, with the stack of the call.

Random operators and uninitialised allocations have nothing to compare and are skipped.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_DEVICE_TYPE = "privateuseone"
#: Results with no defined contents (allocations) or nothing to shadow.
_SKIPPED = frozenset(
    {
        "aten::empty.memory_format",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "aten::set_",
        "aten::set_.source_Storage",
        "aten::set_.source_Storage_storage_offset",
        "aten::set_.source_Tensor",
        "aten::record_stream",
    }
)


@dataclass(frozen=True)
class Divergence:
    """The first operator whose device result differed from the CPU's."""

    op: str
    detail: str
    stack: tuple[traceback.FrameSummary, ...]


def _close(device: torch.Tensor, cpu: torch.Tensor, rtol: float, atol: float) -> Optional[str]:
    got = device.detach().cpu()
    if got.shape != cpu.shape:
        return f"shape {tuple(got.shape)} on the device, {tuple(cpu.shape)} on the CPU"
    if got.dtype != cpu.dtype:
        return f"dtype {got.dtype} on the device, {cpu.dtype} on the CPU"
    if got.is_floating_point() or got.is_complex():
        if torch.allclose(got, cpu, rtol=rtol, atol=atol, equal_nan=True):
            return None
        worst = (got.double() - cpu.double()).abs().nan_to_num(float("inf")).max().item()
        return f"values differ (largest difference {worst:.6g})"
    if torch.equal(got, cpu):
        return None
    mismatched = int((got != cpu).sum().item())
    return f"{mismatched} of {got.numel()} values differ"


class Shadow(TorchDispatchMode):
    """Compares each device operator with the CPU; :attr:`divergence` holds the first miss."""

    def __init__(self, rtol: float = 1e-4, atol: float = 1e-5) -> None:
        super().__init__()
        self.rtol = rtol
        self.atol = atol
        self.divergence: Optional[Divergence] = None
        self.compared = 0

    def _skip(self, func: Any) -> bool:
        return func.name() in _SKIPPED or torch.Tag.nondeterministic_seeded in func.tags

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        on_device = any(
            (isinstance(v, torch.Tensor) and v.device.type == _DEVICE_TYPE)
            or (isinstance(v, torch.device) and v.type == _DEVICE_TYPE)
            for v in flat
        )
        if self.divergence is not None or not on_device or self._skip(func):
            return func(*args, **kwargs)

        def to_cpu(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.device.type == _DEVICE_TYPE:
                return value.detach().cpu()
            if isinstance(value, torch.device) and value.type == _DEVICE_TYPE:
                return torch.device("cpu")
            return value

        cpu_args, cpu_kwargs = tree_map(to_cpu, (args, kwargs))
        result = func(*args, **kwargs)
        try:
            expected = func(*cpu_args, **cpu_kwargs)
        except Exception:  # the CPU cannot run this call: nothing to compare with
            return result
        self.compared += 1
        pairs: list[tuple[Any, Any]] = list(zip(tree_flatten(result)[0], tree_flatten(expected)[0]))
        for i, argument in enumerate(func._schema.arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                before = args[i] if i < len(args) else kwargs.get(argument.name)
                after = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(argument.name)
                pairs.extend(zip(tree_flatten(before)[0], tree_flatten(after)[0]))
        for got, want in pairs:
            problem = None
            if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
                problem = _close(got, want, self.rtol, self.atol)
            elif not isinstance(got, torch.Tensor) and got != want:
                problem = f"{got!r} on the device, {want!r} on the CPU"
            if problem is not None:
                stack = tuple(traceback.extract_stack()[:-1])
                self.divergence = Divergence(func.name(), problem, stack)
                break
        return result
