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

Every other call goes to DirectML's own kernel, through PyTorch's structured composite (its
meta function sizes and types the output, then DirectML's ``mul.out``/``sum.IntList_out``
runs), so only the calls DirectML gets wrong change path. Each fix waits until a tensor of its
dtype first exists on the device (:mod:`dmlpatch.opfix.triggers`): a program that never puts a
bool (uint8) tensor there never pays a Python call on its products (sums); after that, each
costs one (``benchmarks/ops.py``).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from dmlpatch.opfix import sentinels
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel

_BOOL = torch.bool
_UINT8 = torch.uint8
_TENSOR = torch.Tensor
#: PyTorch's structured kernels for any backend: meta, then DirectML's own ``.out`` kernel.
_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional
_mul_kernel = torch.ops.aten.mul.Tensor
_mul_in_place = torch.ops.aten.mul_.Tensor
_sum_kernel = torch.ops.aten.sum.dim_IntList


def _mul(self: torch.Tensor, other: Union[torch.Tensor, complex]) -> torch.Tensor:
    # A Python number (x * 2 reaches mul.Tensor as a wrapped number) arrives as itself; either
    # operand may be a CPU scalar tensor (a scheduler's beta ** 0.5 times a device tensor).
    sentinels.stand_aside()
    if type(other) is _TENSOR and other.dtype is _BOOL and self.dtype is not _BOOL:
        record("fixed", "aten::mul.out")
        other = other.to(torch.result_type(self, other))
    result: torch.Tensor = _mul_kernel._op_dk(_COMPOSITE, self, other)
    return result


def _mul_(self: torch.Tensor, other: Union[torch.Tensor, complex]) -> torch.Tensor:
    sentinels.stand_aside()
    if type(other) is _TENSOR and other.dtype is _BOOL and self.dtype is not _BOOL:
        record("fixed", "aten::mul.out")
        other = other.to(self.dtype)
    result: torch.Tensor = _mul_in_place._op_dk(_COMPOSITE, self, other)
    return result


def _sum(
    self: torch.Tensor,
    dim: Optional[list[int]],
    keepdim: bool = False,
    *,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    if self.dtype is _UINT8:
        record("fixed", "aten::sum.IntList_out")
        total: torch.Tensor = _sum_kernel._op_dk(_COMPOSITE, self.to(torch.int64), dim, keepdim)
        return total if dtype in (None, torch.int64) else total.to(dtype)
    result: torch.Tensor = _sum_kernel._op_dk(_COMPOSITE, self, dim, keepdim, dtype=dtype)
    return result


KERNELS = (
    Kernel("mul.Tensor", _mul, "quirk", quirk="float-times-bool", trigger="bool"),
    Kernel("mul_.Tensor", _mul_, "quirk", quirk="float-times-bool", trigger="bool"),
    Kernel("sum.dim_IntList", _sum, "quirk", quirk="uint8-reduction", trigger="uint8"),
)
