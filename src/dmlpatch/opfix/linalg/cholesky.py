"""``torch.linalg.cholesky`` (and ``cholesky_ex``) on the device: column by column, as LAPACK's
``potrf``.

torch-directml 0.2.5 has no Cholesky kernel: every call copies the matrix to the CPU and the
factor back, and on a GPU waits for its queue to drain. It is on the hot path of every
``torch.distributions.MultivariateNormal`` (its ``scale_tril``), of Gaussian processes and of
whitening. Here column ``j`` of ``L`` is the lower part of ``A``'s column ``j`` less the products
of the columns already made, divided by the square root of its diagonal entry: one matrix
product and a handful of elementwise kernels per column, for the whole batch at once, none
reading back to the host. ``info`` is LAPACK's: the (1-based) order of the first leading minor
that is not positive definite (a diagonal entry not above zero, or NaN), 0 where there is
none; the factor is then unspecified, as on the CPU. Only the triangle LAPACK reads is read
(the lower one, or the upper with ``upper=True``, whose result is ``L^T`` as the CPU's is).

Nine kernels a column cost more than the fallback's read-back on the shipped adapter profiles
for any single matrix, so each call takes the composition only where the cost model prices it
lower for its shapes (``COSTS``, :mod:`dmlpatch.costs.choice`): batches of hundreds of
thousands of small matrices, and solves of a few columns; ``DMLPATCH_DEVICE_OPS`` keeps it.
Matrices wider than :data:`WIDEST`, ``check_errors=True`` (which raises from the CPU's own
check) and dtypes other than float32 and float64 go through the CPU as DirectML's fallback
would, counted and said as one; ``DMLPATCH_CPU_OPS=aten::linalg_cholesky_ex`` sends all of them
there. autograd differentiates the factor with PyTorch's own formula (triangular solves,
:mod:`dmlpatch.opfix.linalg.lu`). ``torch.cholesky_solve`` with such a factor is two
triangular solves on the device, up to the same width, and ``torch.cholesky_inverse`` is one
triangular inverse and its Gram matrix.
"""

from __future__ import annotations

import torch

from dmlpatch.costs.choice import Chooser, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import call_costs
from dmlpatch.opfix.linalg.lu import (
    WIDEST_TRIANGLE,
    column_major,
    first_flagged,
    substituted,
    triangular,
)
from dmlpatch.opfix.linalg.operands import FLOATS, square_floats, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The widest matrix factored on the device (one column at a time).
WIDEST = 64

_FACTOR = Chooser("aten::linalg_cholesky_ex")
_SOLVE = Chooser("aten::_cholesky_solve_helper")
_INVERSE = Chooser("aten::cholesky_inverse")


def factor(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, info)`` of the lower triangle of ``a`` (``(..., n, n)``)."""
    n = a.shape[-1]
    source = a.tril()
    lower = torch.zeros_like(source, memory_format=torch.contiguous_format)
    failed = []
    for j in range(n):
        column = source[..., j:, j]
        if j:
            column = column - (lower[..., j:, :j] @ lower[..., j, :j].unsqueeze(-1)).squeeze(-1)
        pivot = column[..., 0]
        refused = ~(pivot > 0)
        failed.append(refused)
        root = torch.where(refused, torch.ones_like(pivot), pivot).sqrt()
        lower[..., j:, j] = column / root.unsqueeze(-1)
    return lower, first_flagged(torch.stack(failed, dim=-1))


def _cholesky_ex(
    a: torch.Tensor, *, upper: bool = False, check_errors: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    if (
        check_errors
        or not square_floats(a, WIDEST)
        or not _FACTOR.on_device((a.shape, a.dtype, upper), lambda: factor_cost(a, upper=upper))
    ):
        return through_the_cpu(
            "aten::linalg_cholesky_ex.L",
            torch.ops.aten.linalg_cholesky_ex,
            (a,),
            upper=upper,
            check_errors=check_errors,
        )
    record("fixed", "aten::linalg_cholesky_ex.L")
    # The CPU's factor is column-major (LAPACK's layout), and code may depend on strides.
    if not upper:
        lower, info = factor(a)
        return column_major(lower), info
    lower, info = factor(a.mT)
    return lower.mT, info


def _cholesky_solve_helper(b: torch.Tensor, factor: torch.Tensor, upper: bool) -> torch.Tensor:
    """``torch.cholesky_solve`` (its batches already broadcast): two triangular solves,
    ``L y = b`` then ``L^T x = y`` (GPyTorch's and the Gaussian processes' solves)."""
    n = factor.shape[-1]
    if (
        factor.dtype not in FLOATS
        or b.dtype != factor.dtype
        or not within(n, WIDEST_TRIANGLE)
        or not _SOLVE.on_device((b.shape, factor.shape, b.dtype), lambda: solve_cost(b, factor))
    ):
        return through_the_cpu(
            "aten::_cholesky_solve_helper",
            torch.ops.aten._cholesky_solve_helper,
            (b, factor, upper),
        )
    record("fixed", "aten::_cholesky_solve_helper")
    lower = factor.mT if upper else factor
    halfway = triangular(lower, b, upper=False, unitriangular=False)
    return triangular(lower.mT, halfway, upper=True, unitriangular=False)


def _cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """``torch.cholesky_inverse`` (``potri``; a ``MultivariateNormal``'s ``precision_matrix``):
    ``A^-1 = L^-T L^-1`` from the factor, exactly symmetric and column-major as the CPU's."""
    if not square_floats(factor, WIDEST_TRIANGLE) or not _INVERSE.on_device(
        (factor.shape, factor.dtype), lambda: inverse_cost(factor)
    ):
        return through_the_cpu(
            "aten::cholesky_inverse", torch.ops.aten.cholesky_inverse, (factor,), upper=upper
        )
    n = factor.shape[-1]
    record("fixed", "aten::cholesky_inverse")
    lower = factor.mT if upper else factor
    identity = torch.zeros(n, n, dtype=factor.dtype, device=factor.device)
    identity.diagonal().fill_(1)
    inverse_factor = triangular(lower, identity.expand_as(lower), upper=False, unitriangular=False)
    product = (inverse_factor.mT @ inverse_factor).tril()
    return column_major(product + product.tril(-1).mT)


def factor_cost(a: torch.Tensor, *, upper: bool = False, check_errors: bool = False) -> Costs:
    """Per column, the product with the columns made and the pivot's test, root and division
    (nine kernels); LAPACK's layout and ``info`` once (``upper``'s factor is a view).
    Elements per kernel: a column's, and the product's share of the columns made."""
    n, batch = a.shape[-1], call_costs.matrices(a.shape)
    flops = batch * n**3 / 3  # potrf
    launches = 9 * n + 11 - int(upper)
    return Costs(
        call_costs.composition(
            launches, 0, batch=batch, itemsize=a.element_size(), elements=1.5 * n, flops=flops
        ),
        call_costs.fallback((a,), a.numel() * a.element_size() + batch * 4, flops),
    )


def solve_cost(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> Costs:
    """Two triangular solves of five kernels a row, less the first row's product each."""
    n, columns, batch = factor.shape[-1], b.shape[-1], call_costs.matrices(b.shape)
    flops = batch * 2 * n * n * columns  # potrs: two trsm
    return Costs(
        call_costs.composition(
            10 * n - 4,
            0,
            batch=batch,
            itemsize=b.element_size(),
            elements=substituted(n, columns),
            flops=flops,
        ),
        call_costs.fallback((b, factor), b.numel() * b.element_size(), flops),
    )


def inverse_cost(factor: torch.Tensor, upper: bool = False) -> Costs:
    """A triangular solve against the identity (five kernels a row), the Gram matrix of its
    result, made symmetric and column-major."""
    n, batch = factor.shape[-1], call_costs.matrices(factor.shape)
    flops = batch * 2 * n**3 / 3  # potri: trtri and lauum, n^3 / 3 each
    size = factor.numel() * factor.element_size()
    return Costs(
        call_costs.composition(
            5 * n + 5,
            0,
            batch=batch,
            itemsize=factor.element_size(),
            elements=0.25 * n * n + 2 * n,
            flops=flops,
        ),
        call_costs.fallback((factor,), size, flops),
    )


def reset() -> None:
    for chooser in (_FACTOR, _SOLVE, _INVERSE):
        chooser.reset()


COSTS = {
    "aten::linalg_cholesky_ex": factor_cost,
    "aten::_cholesky_solve_helper": solve_cost,
    "aten::cholesky_inverse": inverse_cost,
}

KERNELS = (
    Kernel("linalg_cholesky_ex", _cholesky_ex, "fallback"),
    Kernel("_cholesky_solve_helper", _cholesky_solve_helper, "fallback"),
    Kernel("cholesky_inverse", _cholesky_inverse, "fallback"),
)
