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
(``mul.out``, ``sum.IntList_out``), so only the calls DirectML gets wrong change path. That
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
        on_device = self if self.device.type != "cpu" else other
        if other.dtype is self.dtype:
            return torch.ops.aten.mul.out(self, other, out=on_device.new_empty(0))
        if other.dtype is _BOOL:
            record("fixed", "aten::mul.out")
            other = other.to(torch.result_type(self, other))
    else:
        on_device = self
    dtype = torch.result_type(self, other)
    return torch.ops.aten.mul.out(self, other, out=on_device.new_empty(0, dtype=dtype))


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
        total = torch.ops.aten.sum.IntList_out(wide, dim, keepdim, out=wide.new_empty(0))
        return total if dtype in (None, torch.int64) else total.to(dtype)
    if dtype is None:
        exact = self.is_floating_point() or self.is_complex()
        dtype = self.dtype if exact else torch.int64
    return torch.ops.aten.sum.IntList_out(
        self, dim, keepdim, dtype=dtype, out=self.new_empty(0, dtype=dtype)
    )


KERNELS = (
    Kernel("mul.Tensor", _mul, "quirk", quirk="float-times-bool"),
    Kernel("mul_.Tensor", _mul_, "quirk", quirk="float-times-bool"),
    Kernel("sum.dim_IntList", _sum, "quirk", quirk="uint8-reduction"),
)
