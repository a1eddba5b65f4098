"""``var_mean``, ``std``, ``amin``, ``aminmax`` and ``cumprod``, which torch-directml 0.2.5 runs
on the CPU, on the device.

``var_mean`` is how several normalisation layers and ``torch.std_mean``-style statistics are
computed (microsoft/DirectML#536); it is ``var`` and ``mean``, both native. ``cumprod`` builds
diffusion schedules and attention decays (#437); it is computed as a parallel prefix product
(``log2(n)`` multiplications of shifted halves), whose rounding differs from the CPU's running
product by float32 rounding only. ``std`` (Demucs normalises every input by it) is the square
root of ``var``, as the CPU kernel computes it (in float32 for float16 and bfloat16: their
variance overflows float16 long before the deviation does). ``amin`` (DirectML has ``amax``
but not its twin; geometry code takes the smallest coordinate of every box and point set) is
``min`` over one dimension at a time, which propagates NaN as ``amin`` does; ``aminmax``
(kornia's range checks) is that ``amin`` and DirectML's ``amax``.

Each is one to four kernels against the fallback's read-back and copies, except ``cumprod``:
two kernels per doubling (``2 * ceil(log2(n))``), each over the whole tensor, so a short
product (a schedule of a thousand steps: 21 kernels) and a very long one on an adapter with
little bandwidth are cheaper through the CPU; the cost model chooses per call
(:func:`cumprod_cost`)."""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into
from dmlpatch.opfix.cost_terms import fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def _var_mean(
    self: torch.Tensor,
    dim: Optional[list[int]] = None,
    *,
    correction: Optional[Union[int, float]] = None,
    keepdim: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    record("fixed", "aten::var_mean.correction")
    variance = torch.var(self, dim, correction=correction, keepdim=keepdim)
    mean = torch.mean(self, dim, keepdim=keepdim)
    return variance, mean


def _std_out(
    self: torch.Tensor,
    dim: Optional[list[int]] = None,
    *,
    correction: Optional[Union[int, float]] = None,
    keepdim: bool = False,
    out: torch.Tensor,
) -> torch.Tensor:
    record("fixed", "aten::std.correction_out")
    # float16 and bfloat16 in float32, as the CPU's and CUDA's kernels accumulate: their
    # variance overflows float16 from a deviation of 256 on, where the deviation does not.
    if self.dtype in (torch.float16, torch.bfloat16):
        self = self.float()
    return into(out, torch.var(self, dim, correction=correction, keepdim=keepdim).sqrt())


def _std(
    self: torch.Tensor,
    dim: Optional[list[int]] = None,
    *,
    correction: Optional[Union[int, float]] = None,
    keepdim: bool = False,
) -> torch.Tensor:
    out = self.new_empty(0, dtype=self.dtype.to_real())
    return _std_out(self, dim, correction=correction, keepdim=keepdim, out=out)


def _reduced_dims(self: torch.Tensor, dim: Optional[list[int]], name: str) -> list[int]:
    """The dimensions ``amin``/``aminmax`` reduce (all for none), each checked non-empty."""
    rank = self.dim()
    bound = max(rank, 1)  # a 0-dim tensor has dimension 0 (and -1)
    for d in dim or ():
        if not -bound <= d < bound:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], "
                f"but got {d})"
            )
    dims = sorted({d % rank for d in dim} if dim and rank else range(rank))
    for d in dims:
        if self.shape[d] == 0:
            raise IndexError(f"{name}: Expected reduction dim {d} to have non-zero size.")
    return dims


def _smallest(self: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    """``min`` over one dimension at a time (native; NaN wins, as in ``amin``)."""
    result = self
    for d in dims:
        result = result.min(d, keepdim=True).values
    if not keepdim:
        for d in reversed(dims):
            result = result.squeeze(d)
    return result if result is not self else self.clone()


def _amin_out(
    self: torch.Tensor, dim: Optional[list[int]] = None, keepdim: bool = False, *, out: torch.Tensor
) -> torch.Tensor:
    dims = _reduced_dims(self, dim, "amin()")
    record("fixed", "aten::amin.out")
    return into(out, _smallest(self, dims, keepdim))


def _amin(
    self: torch.Tensor, dim: Optional[list[int]] = None, keepdim: bool = False
) -> torch.Tensor:
    return _amin_out(self, dim, keepdim, out=self.new_empty(0))


def _aminmax_out(
    self: torch.Tensor,
    *,
    dim: Optional[int] = None,
    keepdim: bool = False,
    min: torch.Tensor,
    max: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    if self.numel() == 0 and dim is None:
        raise RuntimeError(
            "aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
            "identity."
        )
    dims = _reduced_dims(self, None if dim is None else [dim], "aminmax")
    record("fixed", "aten::aminmax.out")
    # amax is DirectML's own; amin is composed as above.
    largest = torch.amax(self, dims, keepdim) if dims else self.clone()
    return into(min, _smallest(self, dims, keepdim)), into(max, largest)


def _aminmax(
    self: torch.Tensor, *, dim: Optional[int] = None, keepdim: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    return _aminmax_out(
        self, dim=dim, keepdim=keepdim, min=self.new_empty(0), max=self.new_empty(0)
    )


def _result_dtype(self: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.dtype:
    """cumprod's: ``dtype`` if given, int64 for integral and boolean inputs, else the input's."""
    if dtype is not None:
        return dtype
    if self.is_floating_point() or self.is_complex():
        return self.dtype
    return torch.int64


def _prefix_product(values: torch.Tensor, dim: int) -> torch.Tensor:
    if values.dim() == 0:
        return values.clone()
    dim = dim % values.dim()
    length = values.shape[dim]
    result = values
    step = 1
    while step < length:
        tail = result.narrow(dim, step, length - step) * result.narrow(dim, 0, length - step)
        result = torch.cat([result.narrow(dim, 0, step), tail], dim)
        step *= 2
    return result.clone() if result is values else result


def cumprod_cost(
    self: torch.Tensor, dim: int, *, dtype: Optional[torch.dtype] = None, out: torch.Tensor
) -> Costs:
    """:func:`_prefix_product`: per doubling of the prefix, a product of shifted halves and a
    ``cat`` (5 passes over the tensor), then the copy into ``out`` (and a cast first where
    ``out``'s dtype differs). The fallback: the tensor down and the product up, a multiply
    per element on the host."""
    length = self.shape[dim % self.dim()] if self.dim() else 1
    doublings = math.ceil(math.log2(length)) if length > 1 else 0
    size = out.element_size()
    cast = 1 if self.dtype != out.dtype else 0
    total = self.numel()
    device = OnDevice(
        launches=2 * doublings + 1 + cast,
        bytes=size * total * (5 * doublings + 2 + 2 * cast),
        flops=float(total * (doublings + 1)),
    )
    return Costs(device, fallback(self, up=total * size, host_flops=float(total)))


_CUMPROD = Chooser("aten::cumprod")
reset = resetting(_CUMPROD)
COSTS: dict[str, CostFunction] = {"aten::cumprod": cumprod_cost}


def _cumprod_out(
    self: torch.Tensor, dim: int, *, dtype: Optional[torch.dtype] = None, out: torch.Tensor
) -> torch.Tensor:
    key = (*shapes(self), dim, out.dtype)
    if not _CUMPROD.on_device(key, lambda: cumprod_cost(self, dim, dtype=dtype, out=out)):
        operator = torch.ops.aten.cumprod.out
        return through_the_cpu("aten::cumprod.out", operator, (self, dim), dtype=dtype, out=out)
    record("fixed", "aten::cumprod.out")
    return into(out, _prefix_product(self.to(out.dtype), dim))


def _cumprod(self: torch.Tensor, dim: int, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    out = self.new_empty(0, dtype=_result_dtype(self, dtype))
    return _cumprod_out(self, dim, dtype=dtype, out=out)


def _cumprod_(self: torch.Tensor, dim: int, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return _cumprod_out(self, dim, dtype=dtype, out=self)


KERNELS = (
    Kernel("var_mean.correction", _var_mean, "fallback"),
    Kernel("std.correction_out", _std_out, "fallback"),
    Kernel("std.correction", _std, "fallback"),
    Kernel("amin.out", _amin_out, "fallback"),
    Kernel("amin", _amin, "fallback"),
    Kernel("aminmax.out", _aminmax_out, "fallback"),
    Kernel("aminmax", _aminmax, "fallback"),
    Kernel("cumprod.out", _cumprod_out, "fallback"),
    Kernel("cumprod", _cumprod, "fallback"),
    Kernel("cumprod_", _cumprod_, "fallback"),
)
