"""DirectML's dtype mistakes, answered on the device: a tensor times a bool tensor, and sums
over uint8.

- ``x * mask`` / ``x *= mask`` with a bool ``mask`` (microsoft/DirectML#686, #737, 0.2.5):
  DirectML returns a bool tensor (``bool(x) and mask``) and, in place, turns ``x`` itself
  bool. Older transformers build causal masks that way (``causal_mask *= arange >
  cache_position``), which then fail in ``masked_fill`` (#702). The fix casts the mask to the
  result's dtype first, which is what PyTorch's type promotion means.
- ``t.sum()`` over a uint8 ``t`` (#619): DirectML raises an error whose text is not UTF-8, so
  the program sees ``UnicodeDecodeError``. The fix sums in int64 and casts to the dtype asked
  for (the CPU's answer: uint8 results wrap the same way).

Every other call goes to DirectML's own kernel, through the ``.out`` variant it registers
(``mul.out``, ``sum.IntList_out``) with an output of the final size, so only the calls DirectML
gets wrong change path. That
still costs a Python call on every multiplication and sum on the device: ``benchmarks/ops.py``
measures it.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel

_BOOL = torch.bool


def _mul(self: torch.Tensor, other: Union[torch.Tensor, complex]) -> torch.Tensor:
    # A Python number (x * 2 reaches mul.Tensor as a wrapped number) arrives as itself; either
    # operand may be a CPU scalar tensor (a scheduler's beta ** 0.5 times a device tensor).
    if isinstance(other, torch.Tensor):
        if other.dtype is _BOOL and self.dtype is not _BOOL:
            record("fixed", "aten::mul.out")
            other = other.to(torch.result_type(self, other))
        dtype = self.dtype if other.dtype is self.dtype else torch.result_type(self, other)
        out = _output(self, other, dtype)
    else:
        out = torch.empty_like(self, dtype=torch.result_type(self, other))
    return torch.ops.aten.mul.out(self, other, out=out)


def _output(self: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The product's tensor, sized as PyTorch would (an ``out=`` tensor DirectML need not
    resize), in the layout of the operand it has the shape of (channels_last stays so)."""
    device = (self if self.device.type != "cpu" else other).device
    shape = self.shape if self.shape == other.shape else None
    shape = shape or torch.broadcast_shapes(self.shape, other.shape)
    for operand in (self, other):
        if operand.shape == shape:
            return torch.empty_like(operand, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _mul_(self: torch.Tensor, other: Union[torch.Tensor, complex]) -> torch.Tensor:
    if isinstance(other, torch.Tensor) and other.dtype is _BOOL and self.dtype is not _BOOL:
        record("fixed", "aten::mul.out")
        other = other.to(self.dtype)
    return torch.ops.aten.mul.out(self, other, out=self)


def _sum(
    self: torch.Tensor,
    dim: Optional[list[int]],
    keepdim: bool = False,
    *,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    if self.dtype is torch.uint8:
        record("fixed", "aten::sum.IntList_out")
        wide = self.to(torch.int64)
        out = wide.new_empty(_reduced(self, dim, keepdim))
        total = torch.ops.aten.sum.IntList_out(wide, dim, keepdim, out=out)
        return total if dtype in (None, torch.int64) else total.to(dtype)
    if dtype is None:
        exact = self.is_floating_point() or self.is_complex()
        dtype = self.dtype if exact else torch.int64
    out = self.new_empty(_reduced(self, dim, keepdim), dtype=dtype)
    return torch.ops.aten.sum.IntList_out(self, dim, keepdim, dtype=dtype, out=out)


def _reduced(self: torch.Tensor, dim: Optional[list[int]], keepdim: bool) -> list[int]:
    """The shape of a sum over ``dim`` (every dimension when it is None or empty)."""
    rank = self.dim()
    dims = range(rank) if not dim else {d % max(rank, 1) for d in dim}
    if keepdim:
        return [1 if d in dims else size for d, size in enumerate(self.shape)]
    return [size for d, size in enumerate(self.shape) if d not in dims]


KERNELS = (
    Kernel("mul.Tensor", _mul, "quirk", quirk="float-times-bool"),
    Kernel("mul_.Tensor", _mul_, "quirk", quirk="float-times-bool"),
    Kernel("sum.dim_IntList", _sum, "quirk", quirk="uint8-reduction"),
)
