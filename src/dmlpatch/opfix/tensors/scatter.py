"""``scatter``/``scatter_`` with an index smaller than ``self`` or ``src`` on the device.

PyTorch lets ``index`` be smaller than ``self`` in every dimension but ``dim`` and smaller than
``src`` in all of them; only the leading block the index covers is read or written. DirectML
refuses both ("DirectML scatter doesn't allow partially modified dimensions..." and "...for
index and source to have different dimensions."). The fix scatters into exactly that block:
``src`` and ``self`` are narrowed (views, no copies) to the index's extent, which DirectML
accepts, and the in-place scatter on the narrowed view of ``self`` writes the block in place.

Autograd stays PyTorch's: its formulas (``grad.scatter(dim, index, 0)``, ``grad.gather``) call
these same kernels. Calls DirectML accepts go to its own kernel (the ``.out`` variants).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _refused(self: torch.Tensor, dim: int, index: torch.Tensor, src: Any) -> bool:
    """Whether DirectML refuses this call (the two rules of errors.md)."""
    if isinstance(src, torch.Tensor) and src.shape != index.shape:
        return True
    if index.dim() != self.dim():
        return False
    dim = dim % max(self.dim(), 1)
    return any(index.shape[d] != self.shape[d] for d in range(self.dim()) if d != dim)


def _validate(
    self: torch.Tensor, dim: int, index: torch.Tensor, src: Any, reduce: Optional[str]
) -> None:
    """PyTorch's own argument errors, from its meta kernel (shapes only, no data)."""

    def meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device="meta")

    if isinstance(src, torch.Tensor):
        if reduce is None:
            torch.ops.aten.scatter.src(meta(self), dim, meta(index), meta(src))
        else:
            torch.ops.aten.scatter.reduce(meta(self), dim, meta(index), meta(src), reduce=reduce)
    elif reduce is None:
        torch.ops.aten.scatter.value(meta(self), dim, meta(index), src)
    else:
        torch.ops.aten.scatter.value_reduce(meta(self), dim, meta(index), src, reduce=reduce)


def _native_into(
    out: torch.Tensor,
    self: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    src: Any,
    reduce: Optional[str],
) -> torch.Tensor:
    """DirectML's own scatter (its ``.out`` kernels), writing into ``out``."""
    if isinstance(src, torch.Tensor):
        if reduce is None:
            return torch.ops.aten.scatter.src_out(self, dim, index, src, out=out)
        return torch.ops.aten.scatter.reduce_out(self, dim, index, src, reduce=reduce, out=out)
    if reduce is None:
        return torch.ops.aten.scatter.value_out(self, dim, index, src, out=out)
    return torch.ops.aten.scatter.value_reduce_out(self, dim, index, src, reduce=reduce, out=out)


def _scatter_block(
    self: torch.Tensor, dim: int, index: torch.Tensor, src: Any, reduce: Optional[str]
) -> None:
    """Scatter into ``self`` in place through views narrowed to the index's extent."""
    dim = dim % max(self.dim(), 1)
    block = self
    if index.dim() == self.dim():
        for d in range(self.dim()):
            if d != dim and index.shape[d] != self.shape[d]:
                block = block.narrow(d, 0, index.shape[d])
    if isinstance(src, torch.Tensor) and src.shape != index.shape:
        for d in range(src.dim()):
            if src.shape[d] != index.shape[d]:
                src = src.narrow(d, 0, index.shape[d])
    _native_into(block, block, dim, index, src, reduce)


def _functional(name: str, reduce_arg: bool) -> Callable[..., torch.Tensor]:
    def kernel(
        self: torch.Tensor, dim: int, index: torch.Tensor, src: Any, *, reduce: Optional[str] = None
    ) -> torch.Tensor:
        if not _refused(self, dim, index, src):
            return _native_into(torch.empty_like(self), self, dim, index, src, reduce)
        _validate(self, dim, index, src, reduce)
        record("fixed", name)
        result = self.clone()
        _scatter_block(result, dim, index, src, reduce)
        return result

    return kernel


def _inplace(name: str) -> Callable[..., torch.Tensor]:
    def kernel(
        self: torch.Tensor, dim: int, index: torch.Tensor, src: Any, *, reduce: Optional[str] = None
    ) -> torch.Tensor:
        if not _refused(self, dim, index, src):
            return _native_into(self, self, dim, index, src, reduce)
        _validate(self, dim, index, src, reduce)
        record("fixed", name)
        _scatter_block(self, dim, index, src, reduce)
        return self

    return kernel


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "DirectML refuses these scatters (an index smaller than self or src): there is no fallback to "
    "choose."
)

KERNELS = tuple(
    Kernel(overload, factory(f"aten::{overload}", "reduce" in overload), "refused")
    if factory is _functional
    else Kernel(overload, _inplace(f"aten::{overload}"), "refused")
    for factory, overloads in (
        (_functional, ("scatter.src", "scatter.value", "scatter.reduce", "scatter.value_reduce")),
        (_inplace, ("scatter_.src", "scatter_.value", "scatter_.reduce", "scatter_.value_reduce")),
    )
    for overload in overloads
)
