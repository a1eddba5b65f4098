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

Every other call goes to DirectML's own ``mul.out``/``sum.IntList_out``, into an output laid
out as the functional form lays it out (allocated at its size for a scaling of a contiguous
tensor, otherwise empty and sized by the structured kernel), so only the calls DirectML gets
wrong change path. Each fix waits until a tensor of its dtype first exists on the device
(:mod:`dmlpatch.opfix.triggers`): a program that never puts a bool (uint8) tensor there never
pays a Python call on its products (sums); after that, each costs one (``benchmarks/ops.py``).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from dmlpatch.opfix import sentinels
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.tensors import transfers

_BOOL = torch.bool
_UINT8 = torch.uint8
_TENSOR = torch.Tensor
_DEVICE = "privateuseone"
#: PyTorch's structured kernels for any backend: meta, then DirectML's own ``.out`` kernel.
_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional
_mul_kernel = torch.ops.aten.mul.Tensor
_mul_in_place = torch.ops.aten.mul_.Tensor
_sum_kernel = torch.ops.aten.sum.dim_IntList
#: Sums of these dtypes are int64 unless a dtype is asked for (PyTorch's rule).
_SUMMED_AS_INT64 = frozenset(
    (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
)
_result_type = torch.result_type
_empty_strided = torch.empty_strided
_empty_like = torch.empty_like
_mul_out = torch.mul
_sum_out = torch.sum
_NOTHING = (0,)
_ONE = (1,)

# The calls DirectML gets right reach its ``.out`` kernel through the Python bindings, not
# through the structured composite called as an operator overload: that boxed call cost twice
# as much, and the composite allocates its output through dmlpatch's allocation kernel, a
# second Python call (benchmarks/ops.py).


def _mul(self: torch.Tensor, other: Union[torch.Tensor, complex]) -> torch.Tensor:
    # A Python number (x * 2 reaches mul.Tensor as a wrapped number) arrives as itself, first
    # too (torch.mul(-1, x): kornia's __rmul__), where the product commutes; either operand may
    # be a CPU scalar tensor (a scheduler's beta ** 0.5 times a device tensor).
    sentinels.stand_aside()
    if not isinstance(self, _TENSOR):
        self, other = other, self
    result_dtype = _result_type(self, other)
    if type(other) is _TENSOR and other.dtype is _BOOL and self.dtype is not _BOOL:
        record("fixed", "aten::mul.out")
        other = other.to(result_dtype)
    if result_dtype in transfers.held_otherwise():
        # x * 1j: the structured composite allocates the complex result under the policy.
        result: torch.Tensor = _mul_kernel._op_dk(_COMPOSITE, self, other)
        return result
    on = self.device
    if on.type == _DEVICE:
        if (type(other) is not _TENSOR or other.dim() == 0) and self.is_contiguous():
            # A scaling of a contiguous tensor is laid out as the tensor itself; allocated at
            # its size, the output needs no resize (a second allocation on the simulator).
            return _mul_out(self, other, out=_empty_like(self, dtype=result_dtype))
    else:
        on = other.device  # self is a CPU scalar: other is the device tensor
    out = _empty_strided(_NOTHING, _ONE, dtype=result_dtype, device=on)
    return _mul_out(self, other, out=out)


def _mul_(self: torch.Tensor, other: Union[torch.Tensor, complex]) -> torch.Tensor:
    sentinels.stand_aside()
    if type(other) is _TENSOR and other.dtype is _BOOL and self.dtype is not _BOOL:
        record("fixed", "aten::mul.out")
        other = other.to(self.dtype)
    if type(other) is not _TENSOR or (
        other.dim() <= self.dim() and (other.numel() == 1 or other.shape == self.shape)
    ):
        # The product has self's shape: writing it to self is the in-place product.
        return _mul_out(self, other, out=self)
    # A broadcast other: the in-place form checks that self keeps its shape, out= would resize.
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
    if dtype is None:
        dtype = torch.int64 if self.dtype in _SUMMED_AS_INT64 else self.dtype
    elif dtype in transfers.held_otherwise():
        # sum(dtype=torch.bfloat16): the composite allocates the result under the policy.
        held: torch.Tensor = _sum_kernel._op_dk(_COMPOSITE, self, dim, keepdim, dtype=dtype)
        return held
    out = _empty_strided(_NOTHING, _ONE, dtype=dtype, device=self.device)
    return _sum_out(self, dim, keepdim, dtype=dtype, out=out)


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "It answers the calls DirectML's own kernel gets wrong (a float times a bool, a uint8 sum) and "
    "leaves every other call to that kernel: a wrong answer is not a cheaper one."
)

KERNELS = (
    Kernel("mul.Tensor", _mul, "quirk", quirk="float-times-bool", trigger="bool"),
    Kernel("mul_.Tensor", _mul_, "quirk", quirk="float-times-bool", trigger="bool"),
    Kernel("sum.dim_IntList", _sum, "quirk", quirk="uint8-reduction", trigger="uint8"),
)
