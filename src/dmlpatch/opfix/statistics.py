"""``var_mean`` and ``cumprod``, which torch-directml 0.2.5 runs on the CPU, on the device.

``var_mean`` is how several normalisation layers and ``torch.std_mean``-style statistics are
computed (microsoft/DirectML#536); it is ``var`` and ``mean``, both native. ``cumprod`` builds
diffusion schedules and attention decays (#437); it is computed as a parallel prefix product
(``log2(n)`` multiplications of shifted halves), whose rounding differs from the CPU's running
product by float32 rounding only.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into


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


def _cumprod_out(
    self: torch.Tensor, dim: int, *, dtype: Optional[torch.dtype] = None, out: torch.Tensor
) -> torch.Tensor:
    record("fixed", "aten::cumprod.out")
    return into(out, _prefix_product(self.to(out.dtype), dim))


def _cumprod(self: torch.Tensor, dim: int, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    out = self.new_empty(0, dtype=_result_dtype(self, dtype))
    return _cumprod_out(self, dim, dtype=dtype, out=out)


def _cumprod_(self: torch.Tensor, dim: int, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return _cumprod_out(self, dim, dtype=dtype, out=self)


KERNELS = (
    Kernel("var_mean.correction", _var_mean, "fallback"),
    Kernel("cumprod.out", _cumprod_out, "fallback"),
    Kernel("cumprod", _cumprod, "fallback"),
    Kernel("cumprod_", _cumprod_, "fallback"),
)
