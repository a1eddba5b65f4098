"""``torch.linalg.inv``, ``solve``, ``det``, ``lu_factor`` and ``solve_triangular`` of small
systems on the device.

torch-directml 0.2.5 registers no linear-algebra kernel but vector norms: ``inv``, ``solve``,
``det``, ``svd``... run on the CPU, two copies per call (microsoft/DirectML#671, #431), and on a
GPU each call also waits for the queue to drain. Small systems, the 3x3 and 4x4 matrices of
geometry code, batched, are solved here the way LAPACK's ``getrf``/``getrs`` solve them on the
CPU: LU factorisation with partial pivoting (the largest magnitude in the column, the first of
equals), then forward and back substitution, one row at a time for every batch element at
once. PyTorch's ``inv`` is a solve against the identity, and so is this one. ``LU`` and
``pivots`` are in LAPACK's layout; ``linalg_lu_solve`` (solve's backward, with ``adjoint``)
substitutes with them here too, ``linalg_lu_factor_ex`` returns them, ``_linalg_det`` is the
product of U's diagonal with the sign of the row swaps, ``lu_unpack`` (``lu_factor``'s
backward, ``torch.linalg.lu``) spreads them into P, L and U (of A^T's factors where PyTorch factors
the transpose: its backward reads them so), and ``linalg_solve_triangular`` is the substitution
alone (``trsm``).

The trade: a fixed call launches about three small kernels per row (``benchmarks/ops.py``:
on the simulator, whose kernels are the CPU's, 64 4x4 inverses take longer fixed than through
the fallback); the fallback makes two copies and drains the GPU's queue. Only systems up to
:data:`LARGEST` rows are fixed; larger ones go through the CPU as DirectML's fallback would
(counted as fallbacks), as do ``check_errors=True`` and dtypes other than
float32 and float64 (``left=False``, ``X A = B``, is ``A^T X^T = B^T``: the other
substitution, on ``B^T``); ``DMLPATCH_CPU_OPS=aten::linalg_inv_ex,aten::_linalg_solve_ex`` sends all
of them there. ``slogdet`` is ``det``'s factorisation, summed as logarithms; triangular solves
(no factorisation, a few kernels per row) are served up to :data:`WIDEST_TRIANGLE` rows.
The other decompositions have modules of their own in this package.
"""

from __future__ import annotations

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg.operands import FLOATS, square, square_floats, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: Largest system solved on the device (rows): geometry's 3x3 and 4x4, the 9x9 normal
#: equations of a homography (kornia's DLT), small filters.
LARGEST = 16
#: Largest triangular system solved on the device (substitution only, no factorisation: the
#: triangular solves of ``MultivariateNormal.log_prob`` and of Cholesky's gradient).
WIDEST_TRIANGLE = 64


def _small(a: torch.Tensor) -> bool:
    return _fits(a) and square(a)


def _fits(a: torch.Tensor) -> bool:
    """A float matrix (or batch) of 1 to :data:`LARGEST` rows and columns."""
    sides = a.shape[-2:]
    if a.dim() < 2 or a.dtype not in FLOATS:
        return False
    return within(min(sides), LARGEST) and max(sides) <= LARGEST


def column_major(m: torch.Tensor) -> torch.Tensor:
    """``m`` in LAPACK's layout, as the CPU's results are (code may read their strides; a
    column's are ``(1, rows)``, which ``m.mT.contiguous().mT`` leaves ``(1, 1)``)."""
    out = m.new_empty(*m.shape[:-2], m.shape[-1], m.shape[-2]).mT
    out.copy_(m)
    return out


def swap_rows(m: torch.Tensor, row: int, other: torch.Tensor) -> None:
    """Swap row ``row`` of each matrix of ``m`` with its row ``other`` (a batch of indices)."""
    index = other.reshape(*other.shape, 1, 1).expand(*other.shape, 1, m.shape[-1])
    theirs = m.gather(-2, index)
    mine = m[..., row : row + 1, :].clone()
    m[..., row : row + 1, :] = theirs
    m.scatter_(-2, index, mine)


def _factor(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``getrf`` of ``(..., m, n)``: ``(LU, pivots, info)``, pivots and info 1-based as
    LAPACK's."""
    m, n = a.shape[-2], a.shape[-1]
    lu = a.contiguous().clone()
    pivots = torch.empty(*a.shape[:-2], min(m, n), dtype=torch.int32, device=a.device)
    for j in range(min(m, n)):
        pivot_row = lu[..., j:, j].abs().argmax(-1) + j
        pivots[..., j] = pivot_row + 1
        swap_rows(lu, j, pivot_row)
        if j + 1 < m:
            pivot = lu[..., j, j]
            # A zero pivot is the column's largest magnitude: the column under it is zero, and
            # LAPACK leaves it unscaled.
            safe = torch.where(pivot == 0, torch.ones_like(pivot), pivot)
            multipliers = lu[..., j + 1 :, j] / safe.unsqueeze(-1)
            lu[..., j + 1 :, j] = multipliers
            if j + 1 < n:
                lu[..., j + 1 :, j + 1 :] -= multipliers.unsqueeze(-1) * lu[..., j : j + 1, j + 1 :]
    return lu, pivots, first_flagged(lu.diagonal(dim1=-2, dim2=-1) == 0)


def first_flagged(flags: torch.Tensor) -> torch.Tensor:
    """LAPACK's ``info`` from a boolean ``(..., n)``: the (1-based) position of the first
    ``True``, 0 where there is none (computed on the device, read by nobody until asked)."""
    flagged = flags.to(torch.int32)
    first = flagged * ((flagged.cumsum(-1) - flagged) == 0).to(torch.int32)
    order = torch.arange(1, flags.shape[-1] + 1, dtype=torch.int32, device=flags.device)
    return (first * order).sum(-1, dtype=torch.int32)


def _substitute(
    lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, adjoint: bool = False
) -> torch.Tensor:
    """``getrs``: the solution of ``A X = B`` (``A^T X = B`` when ``adjoint``) from A's factors
    ``P A = L U`` (batches already broadcast)."""
    n = lu.shape[-1]
    x = b.contiguous().clone()
    rows = [slice(i, i + 1) for i in range(n)]
    if not adjoint:
        for j in range(n):
            swap_rows(x, j, pivots[..., j].long() - 1)
        for i in range(1, n):  # L y = P b, L unit lower
            x[..., rows[i], :] -= lu[..., rows[i], :i] @ x[..., :i, :]
        for i in range(n - 1, -1, -1):  # U x = y
            x[..., rows[i], :] -= lu[..., rows[i], i + 1 :] @ x[..., i + 1 :, :]
            x[..., rows[i], :] /= lu[..., rows[i], rows[i]]
        return x
    upper_t = lu.transpose(-2, -1)
    for i in range(n):  # U^T w = b, U^T lower
        x[..., rows[i], :] -= upper_t[..., rows[i], :i] @ x[..., :i, :]
        x[..., rows[i], :] /= upper_t[..., rows[i], rows[i]]
    for i in range(n - 2, -1, -1):  # L^T v = w, L^T unit upper
        x[..., rows[i], :] -= upper_t[..., rows[i], i + 1 :] @ x[..., i + 1 :, :]
    for j in range(n - 1, -1, -1):  # x = P^T v
        swap_rows(x, j, pivots[..., j].long() - 1)
    return x


def _substitute_broadcast(
    lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, adjoint: bool = False
) -> torch.Tensor:
    """:func:`_substitute` over the broadcast batch of the factors and B."""
    batch = torch.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    n, k = lu.shape[-1], b.shape[-1]
    return _substitute(
        lu.expand(*batch, n, n), pivots.expand(*batch, n), b.expand(*batch, n, k), adjoint
    )


def _lu_solve(
    lu: torch.Tensor,
    pivots: torch.Tensor,
    b: torch.Tensor,
    *,
    left: bool = True,
    adjoint: bool = False,
) -> torch.Tensor:
    fits = _small(lu) and b.dtype == lu.dtype and b.dim() >= 2
    if not fits or not _sides_agree(lu, b, left):
        return through_the_cpu(
            "aten::linalg_lu_solve.out",
            torch.ops.aten.linalg_lu_solve,
            (lu, pivots, b),
            left=left,
            adjoint=adjoint,
        )
    record("fixed", "aten::linalg_lu_solve.out")
    return _substitute_on_side(lu, pivots, b, left, adjoint)


def _sides_agree(a: torch.Tensor, b: torch.Tensor, left: bool) -> bool:
    """B's rows (its columns, from the right) are as many as A's columns."""
    return b.shape[-2 if left else -1] == a.shape[-1]


def _substitute_on_side(
    lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, left: bool, adjoint: bool
) -> torch.Tensor:
    """:func:`_substitute_broadcast` for ``A X = B``, or ``X A = B`` (``A^T X^T = B^T``: the
    other substitution, on B^T) when not ``left``."""
    if left:
        return _substitute_broadcast(lu, pivots, b, adjoint)
    return _substitute_broadcast(lu, pivots, b.mT, not adjoint).mT


def _inv_ex(a: torch.Tensor, *, check_errors: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if check_errors or not _small(a):
        return through_the_cpu(
            "aten::linalg_inv_ex.inverse",
            torch.ops.aten.linalg_inv_ex,
            (a,),
            check_errors=check_errors,
        )
    record("fixed", "aten::linalg_inv_ex.inverse")
    n = a.shape[-1]
    identity = torch.zeros(n, n, dtype=a.dtype, device=a.device)
    identity.diagonal().fill_(1)
    lu, pivots, info = _factor(a)
    return _substitute_broadcast(lu, pivots, identity), info


def _solve_ex(
    a: torch.Tensor, b: torch.Tensor, *, left: bool = True, check_errors: bool = False
) -> tuple[torch.Tensor, ...]:
    # PyTorch's rule: B is a batch of vectors when it has one dimension fewer than A.
    vectors = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    matrices = b.unsqueeze(-1) if vectors else b
    fits = _small(a) and b.dtype == a.dtype and matrices.dim() >= 2
    if check_errors or not fits or (vectors and not left) or not _sides_agree(a, matrices, left):
        return through_the_cpu(
            "aten::_linalg_solve_ex.result",
            torch.ops.aten._linalg_solve_ex,
            (a, b),
            left=left,
            check_errors=check_errors,
        )
    record("fixed", "aten::_linalg_solve_ex.result")
    # torch 2.4 factors a row-major A as A^T and solves with the adjoint; its backward reads
    # LU that way, so the factors returned must be A^T's.
    transposed = a.is_contiguous() and _factors_the_transpose()
    lu, pivots, info = _factor(a.mT if transposed else a)
    x = _substitute_on_side(lu, pivots, matrices, left, adjoint=transposed)
    return (x.squeeze(-1) if vectors else x), lu, pivots, info


_TRANSPOSED: list[bool] = []


def _factors_the_transpose() -> bool:
    """Whether this torch's ``_linalg_solve_ex`` returns the LU of A^T for a row-major A
    (torch 2.4 does, to save a copy; later releases return A's); asked once, on the CPU."""
    if not _TRANSPOSED:
        a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        lu = torch.ops.aten._linalg_solve_ex(a, torch.ones(2, 1))[1]
        _TRANSPOSED.append(not torch.allclose(lu, torch.linalg.lu_factor(a)[0]))
    return _TRANSPOSED[0]


def _lu_factor_ex(
    a: torch.Tensor, *, pivot: bool = True, check_errors: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not pivot or check_errors or not _fits(a):
        return through_the_cpu(
            "aten::linalg_lu_factor_ex.out",
            torch.ops.aten.linalg_lu_factor_ex,
            (a,),
            pivot=pivot,
            check_errors=check_errors,
        )
    record("fixed", "aten::linalg_lu_factor_ex.out")
    return _factor(a)


def _lu_unpack(
    lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = (lu.shape[-2], lu.shape[-1]) if lu.dim() >= 2 else (0, 0)
    if lu.dtype not in FLOATS or not within(m, LARGEST) or n > LARGEST:
        return through_the_cpu(
            "aten::lu_unpack.out",
            torch.ops.aten.lu_unpack,
            (lu, pivots),
            unpack_data=unpack_data,
            unpack_pivots=unpack_pivots,
        )
    record("fixed", "aten::lu_unpack.out")
    return _unpacked(lu, pivots, unpack_data, unpack_pivots)


def _unpacked(
    lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool, unpack_pivots: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``lu_unpack``: ``(P, L, U)`` from ``getrf``'s factors."""
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    nothing = lu.new_empty(0)
    lower = upper = permutation = nothing
    if unpack_data:
        lower = lu[..., :, :k].tril(-1)
        lower.diagonal(dim1=-2, dim2=-1).fill_(1)
        upper = lu[..., :k, :].triu()
    if unpack_pivots:
        # getrf's swaps applied in order to the identity are P^T of A = P L U.
        rows = torch.zeros(m, m, dtype=lu.dtype, device=lu.device)
        rows.diagonal().fill_(1)
        rows = rows.expand(*pivots.shape[:-1], m, m).clone()
        for j in range(pivots.shape[-1]):
            swap_rows(rows, j, pivots[..., j].long() - 1)
        permutation = rows.mT
    return permutation, lower, upper


def _lu(a: torch.Tensor, *, pivot: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.linalg.lu``: ``(P, L, U)`` with ``A = P L U``, A's own factors unpacked."""
    if not pivot or not _fits(a):
        return through_the_cpu("aten::linalg_lu.out", torch.ops.aten.linalg_lu, (a,), pivot=pivot)
    record("fixed", "aten::linalg_lu.out")
    lu, pivots, _ = _factor(a)
    return _unpacked(lu, pivots, unpack_data=True, unpack_pivots=True)


def _det(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not _small(a):
        return through_the_cpu("aten::_linalg_det.result", torch.ops.aten._linalg_det, (a,))
    record("fixed", "aten::_linalg_det.result")
    # PyTorch factors A^T for a row-major real A (det(A^T) = det(A)), and its backward solves
    # with those factors as A^T's.
    lu, pivots, _ = _factor(a.mT if a.is_contiguous() else a)
    return _swaps_sign(pivots, a.dtype) * lu.diagonal(dim1=-2, dim2=-1).prod(-1), lu, pivots


def _slogdet(
    a: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not _small(a):
        return through_the_cpu("aten::_linalg_slogdet.sign", torch.ops.aten._linalg_slogdet, (a,))
    record("fixed", "aten::_linalg_slogdet.sign")
    lu, pivots, _ = _factor(a.mT if a.is_contiguous() else a)  # as _det: A^T's factors
    diagonal = lu.diagonal(dim1=-2, dim2=-1)
    return (
        _swaps_sign(pivots, a.dtype) * diagonal.sign().prod(-1),
        diagonal.abs().log().sum(-1),
        lu,
        pivots,
    )


def _swaps_sign(pivots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The sign of the permutation ``getrf``'s row swaps make: -1 for an odd number."""
    order = torch.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype, device=pivots.device)
    swaps = (pivots != order).sum(-1)
    return 1 - 2 * (swaps % 2).to(dtype)


def triangular(a: torch.Tensor, b: torch.Tensor, upper: bool, unitriangular: bool) -> torch.Tensor:
    """``trsm``: X with ``A X = B``, A triangular (batches already broadcast)."""
    n = a.shape[-1]
    x = b.contiguous().clone()
    rows = range(n - 1, -1, -1) if upper else range(n)
    for i in rows:
        row = slice(i, i + 1)
        known = slice(i + 1, n) if upper else slice(0, i)
        if known.start != known.stop:
            x[..., row, :] -= a[..., row, known] @ x[..., known, :]
        if not unitriangular:
            x[..., row, :] /= a[..., row, row]
    return x


def _solve_triangular(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    upper: bool,
    left: bool = True,
    unitriangular: bool = False,
) -> torch.Tensor:
    if not _triangular_fits(a, b):
        return through_the_cpu(
            "aten::linalg_solve_triangular.out",
            torch.ops.aten.linalg_solve_triangular,
            (a, b),
            upper=upper,
            left=left,
            unitriangular=unitriangular,
        )
    record("fixed", "aten::linalg_solve_triangular.out")
    if not left:  # X A = B is A^T X^T = B^T, A^T triangular the other way
        a, b, upper = a.mT, b.mT, not upper
    x = triangular(*_broadcast(a, b), upper, unitriangular)
    return x if left else x.mT


def _triangular_fits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """A float square A of at most :data:`WIDEST_TRIANGLE` rows, and a B of its dtype."""
    return square_floats(a, WIDEST_TRIANGLE) and b.dtype == a.dtype and b.dim() >= 2


def _broadcast(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B expanded to their common batch."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])


def _triangular_solve(
    b: torch.Tensor,
    a: torch.Tensor,
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The deprecated ``torch.triangular_solve`` (still in GPyTorch, Pyro and older geometry
    code): ``(X, A)`` with ``op(A) X = B``, both broadcast and column-major as the CPU's."""
    if not _triangular_fits(a, b) or b.shape[-2] != a.shape[-1]:
        return through_the_cpu(
            "aten::triangular_solve.X",
            torch.ops.aten.triangular_solve,
            (b, a),
            upper=upper,
            transpose=transpose,
            unitriangular=unitriangular,
        )
    record("fixed", "aten::triangular_solve.X")
    coefficient, rhs = _broadcast(a, b)
    solved = triangular(
        coefficient.mT if transpose else coefficient,
        rhs,
        upper != transpose,
        unitriangular,
    )
    return column_major(solved), column_major(coefficient)


KERNELS = (
    Kernel("linalg_lu_factor_ex", _lu_factor_ex, "fallback"),
    Kernel("_linalg_det", _det, "fallback"),
    Kernel("_linalg_slogdet", _slogdet, "fallback"),
    Kernel("lu_unpack", _lu_unpack, "fallback"),
    Kernel("linalg_solve_triangular", _solve_triangular, "fallback"),
    Kernel("linalg_inv_ex", _inv_ex, "fallback"),
    Kernel("_linalg_solve_ex", _solve_ex, "fallback"),
    Kernel("linalg_lu_solve", _lu_solve, "fallback"),
    Kernel("linalg_lu", _lu, "fallback"),
    Kernel("triangular_solve", _triangular_solve, "fallback"),
)
