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

The trade: a factorisation launches 17 small kernels per column and a substitution 5 per row;
the fallback makes two copies and drains the GPU's queue. Each call takes whichever the cost
model prices lower for its shapes on the adapter (``COSTS``, :mod:`dmlpatch.costs.choice`):
on the shipped profiles a triangular solve, an ``lu_solve`` or ``lu_unpack`` of a few rows is
composed, and a factorisation goes through the fallback but for batches of hundreds of
thousands; ``DMLPATCH_DEVICE_OPS`` keeps the composition. Only systems up to
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

from dmlpatch.costs.choice import Chooser, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import call_costs
from dmlpatch.opfix.linalg.operands import FLOATS, square, square_floats, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: Largest system solved on the device (rows): geometry's 3x3 and 4x4, the 9x9 normal
#: equations of a homography (kornia's DLT), small filters.
LARGEST = 16
#: Largest triangular system solved on the device (substitution only, no factorisation: the
#: triangular solves of ``MultivariateNormal.log_prob`` and of Cholesky's gradient).
WIDEST_TRIANGLE = 64

_LU_FACTOR = Chooser("aten::linalg_lu_factor_ex")
_DET = Chooser("aten::_linalg_det")
_SLOGDET = Chooser("aten::_linalg_slogdet")
_LU_UNPACK = Chooser("aten::lu_unpack")
_SOLVE_TRIANGULAR = Chooser("aten::linalg_solve_triangular")
_INV = Chooser("aten::linalg_inv_ex")
_SOLVE = Chooser("aten::_linalg_solve_ex")
_LU_SOLVE = Chooser("aten::linalg_lu_solve")
_LU = Chooser("aten::linalg_lu")
_TRIANGULAR_SOLVE = Chooser("aten::triangular_solve")


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
    if (
        not fits
        or not _sides_agree(lu, b, left)
        or not _LU_SOLVE.on_device(
            (lu.shape, b.shape, b.dtype, left), lambda: lu_solve_cost(lu, pivots, b, left=left)
        )
    ):
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
    if check_errors or not _small(a) or not _INV.on_device((a.shape, a.dtype), lambda: inv_cost(a)):
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
    if (
        check_errors
        or not fits
        or (vectors and not left)
        or not _sides_agree(a, matrices, left)
        or not _SOLVE.on_device(
            (a.shape, b.shape, a.dtype, left), lambda: solve_cost(a, b, left=left)
        )
    ):
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
    if (
        not pivot
        or check_errors
        or not _fits(a)
        or not _LU_FACTOR.on_device((a.shape, a.dtype), lambda: lu_factor_cost(a))
    ):
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
    if (
        lu.dtype not in FLOATS
        or not within(m, LARGEST)
        or n > LARGEST
        or not _LU_UNPACK.on_device(
            (lu.shape, pivots.shape, lu.dtype, unpack_data, unpack_pivots),
            lambda: lu_unpack_cost(lu, pivots, unpack_data, unpack_pivots),
        )
    ):
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
    if not pivot or not _fits(a) or not _LU.on_device((a.shape, a.dtype), lambda: lu_cost(a)):
        return through_the_cpu("aten::linalg_lu.out", torch.ops.aten.linalg_lu, (a,), pivot=pivot)
    record("fixed", "aten::linalg_lu.out")
    lu, pivots, _ = _factor(a)
    return _unpacked(lu, pivots, unpack_data=True, unpack_pivots=True)


def _det(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not _small(a) or not _DET.on_device((a.shape, a.dtype), lambda: det_cost(a)):
        return through_the_cpu("aten::_linalg_det.result", torch.ops.aten._linalg_det, (a,))
    record("fixed", "aten::_linalg_det.result")
    # PyTorch factors A^T for a row-major real A (det(A^T) = det(A)), and its backward solves
    # with those factors as A^T's.
    lu, pivots, _ = _factor(a.mT if a.is_contiguous() else a)
    return _swaps_sign(pivots, a.dtype) * lu.diagonal(dim1=-2, dim2=-1).prod(-1), lu, pivots


def _slogdet(
    a: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not _small(a) or not _SLOGDET.on_device((a.shape, a.dtype), lambda: slogdet_cost(a)):
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
    if not _triangular_fits(a, b) or not _SOLVE_TRIANGULAR.on_device(
        (a.shape, b.shape, a.dtype, left, unitriangular),
        lambda: solve_triangular_cost(a, b, upper=upper, left=left, unitriangular=unitriangular),
    ):
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
    if (
        not _triangular_fits(a, b)
        or b.shape[-2] != a.shape[-1]
        or not _TRIANGULAR_SOLVE.on_device(
            (b.shape, a.shape, a.dtype, unitriangular),
            lambda: triangular_solve_cost(b, a, unitriangular=unitriangular),
        )
    ):
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


# What each kernel costs (:mod:`dmlpatch.opfix.linalg.call_costs`). Kernels per column of
# getrf (:func:`_factor`): the pivot's search and its row swap, the multipliers and the
# trailing update, 17 in all; per row of a substitution (:func:`_substitute`), a row swap and a
# product and subtraction each way, 14; per row of trsm (:func:`triangular`), a product,
# a subtraction and a division, 5 (3 without the division). Flops are LAPACK's (Golub and Van
# Loan): getrf ``m n^2 - n^3 / 3``, getrs ``2 n^2`` per column of B, getri ``4 n^3 / 3``.


def _factored(m: int, n: int) -> float:
    """Elements a kernel of :func:`_factor` touches per matrix (a column, the trailing
    matrix's share)."""
    return 0.2 * m * n + max(m, n)


def substituted(n: int, columns: int) -> float:
    """Elements a kernel of a substitution touches per matrix: a row of A, the rows of X
    solved before it (half of them on average) and its own."""
    return 2 + columns + 0.15 * n * (1 + columns)


def _getrf_flops(m: int, n: int) -> float:
    k = min(m, n)
    return max(m, n) * k * k - k**3 / 3


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def lu_factor_cost(a: torch.Tensor, *, pivot: bool = True, check_errors: bool = False) -> Costs:
    m, n, batch = a.shape[-2], a.shape[-1], call_costs.matrices(a.shape)
    k = min(m, n)
    # A tall matrix's last column is scaled too (five kernels); info from the diagonal once.
    launches = 17 * k + 3 + (5 if m > n else 0)
    flops = batch * _getrf_flops(m, n)
    return Costs(
        call_costs.composition(
            launches,
            0,
            batch=batch,
            itemsize=a.element_size(),
            elements=_factored(m, n),
            flops=flops,
        ),
        call_costs.fallback((a,), _bytes(a) + batch * (k + 1) * call_costs.INDEX_BYTES, flops),
    )


def det_cost(a: torch.Tensor) -> Costs:
    """getrf and the product of U's diagonal with the swaps' sign."""
    return _determinant(a, launches=17 * a.shape[-1] + 13, values=1)


def slogdet_cost(a: torch.Tensor) -> Costs:
    """getrf, the swaps' sign and the sum of logarithms."""
    return _determinant(a, launches=17 * a.shape[-1] + 17, values=2)


def _determinant(a: torch.Tensor, launches: int, values: int) -> Costs:
    n, batch = a.shape[-1], call_costs.matrices(a.shape)
    flops = batch * _getrf_flops(n, n)
    results = values * batch * a.element_size() + _bytes(a) + batch * n * call_costs.INDEX_BYTES
    return Costs(
        call_costs.composition(
            launches,
            0,
            batch=batch,
            itemsize=a.element_size(),
            elements=_factored(n, n),
            flops=flops,
        ),
        call_costs.fallback((a,), results, flops),
    )


def lu_unpack_cost(
    lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True
) -> Costs:
    """L and U are masks of LU (three kernels); P is each pivot's row swap applied to the
    identity."""
    m, n, batch = lu.shape[-2], lu.shape[-1], call_costs.matrices(lu.shape)
    k = min(m, n)
    written = (m * k + k * n) * int(unpack_data) + m * m * int(unpack_pivots)
    flops = batch * written  # no arithmetic: the elements written
    return Costs(
        _unpacking(lu, unpack_data, unpack_pivots),
        call_costs.fallback((lu, pivots), batch * written * lu.element_size(), flops),
    )


def _unpacking(lu: torch.Tensor, unpack_data: bool, unpack_pivots: bool) -> OnDevice:
    m, n, batch = lu.shape[-2], lu.shape[-1], call_costs.matrices(lu.shape)
    k = min(m, n)
    return call_costs.composition(
        3 * int(unpack_data) + (6 * k + 3) * int(unpack_pivots),
        0,
        batch=batch,
        itemsize=lu.element_size(),
        elements=0.4 * m * m + 2 * m,
        flops=batch * ((m * k + k * n) * int(unpack_data) + m * m * int(unpack_pivots)),
    )


def solve_triangular_cost(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    upper: bool,
    left: bool = True,
    unitriangular: bool = False,
) -> Costs:
    n = a.shape[-1]
    columns = b.shape[-1] if left else b.shape[-2]
    # X A = B is solved as A^T X^T = B^T: one copy more.
    launches = (3 if unitriangular else 5) * n - 2 + (0 if left else 1)
    return _substitution(a, b, launches, columns, results=1)


def triangular_solve_cost(
    b: torch.Tensor,
    a: torch.Tensor,
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> Costs:
    """trsm and both results in LAPACK's layout."""
    launches = (3 if unitriangular else 5) * a.shape[-1]
    return _substitution(a, b, launches, b.shape[-1], results=2)


def _substitution(
    a: torch.Tensor, b: torch.Tensor, launches: int, columns: int, results: int
) -> Costs:
    n = a.shape[-1]
    batch = max(call_costs.matrices(a.shape), call_costs.matrices(b.shape))
    flops = batch * n * n * columns  # trsm
    up = batch * n * columns * b.element_size() + (results - 1) * batch * n * n * a.element_size()
    return Costs(
        call_costs.composition(
            launches,
            0,
            batch=batch,
            itemsize=a.element_size(),
            elements=substituted(n, columns),
            flops=flops,
        ),
        call_costs.fallback((a, b), up, flops),
    )


def inv_cost(a: torch.Tensor, *, check_errors: bool = False) -> Costs:
    """getrf and a substitution against the identity."""
    n, batch = a.shape[-1], call_costs.matrices(a.shape)
    flops = batch * (_getrf_flops(n, n) + 4 * n**3 / 3)  # getrf and getri
    elements = (17 * _factored(n, n) + 14 * substituted(n, n)) / 31
    return Costs(
        call_costs.composition(
            31 * n + 3, 0, batch=batch, itemsize=a.element_size(), elements=elements, flops=flops
        ),
        call_costs.fallback((a,), _bytes(a) + batch * call_costs.INDEX_BYTES, flops),
    )


def solve_cost(
    a: torch.Tensor, b: torch.Tensor, *, left: bool = True, check_errors: bool = False
) -> Costs:
    """getrf and getrs (from the right, on B^T: one copy more)."""
    n, batch = a.shape[-1], max(call_costs.matrices(a.shape), call_costs.matrices(b.shape))
    vectors = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    columns = 1 if vectors else b.shape[-1 if left else -2]
    flops = batch * (_getrf_flops(n, n) + 2 * n * n * columns)
    elements = (17 * _factored(n, n) + 14 * substituted(n, columns)) / 31
    results = (
        batch * n * columns * b.element_size()
        + batch * n * n * a.element_size()
        + batch * (n + 1) * call_costs.INDEX_BYTES
    )
    return Costs(
        call_costs.composition(
            31 * n + 1 + (0 if left else 1),
            0,
            batch=batch,
            itemsize=a.element_size(),
            elements=elements,
            flops=flops,
        ),
        call_costs.fallback((a, b), results, flops),
    )


def lu_solve_cost(
    lu: torch.Tensor,
    pivots: torch.Tensor,
    b: torch.Tensor,
    *,
    left: bool = True,
    adjoint: bool = False,
) -> Costs:
    n = lu.shape[-1]
    batch = max(call_costs.matrices(lu.shape), call_costs.matrices(b.shape))
    columns = b.shape[-1 if left else -2]
    flops = batch * 2 * n * n * columns  # getrs
    return Costs(
        call_costs.composition(
            14 * n - 2 + (0 if left else 1),
            0,
            batch=batch,
            itemsize=b.element_size(),
            elements=substituted(n, columns),
            flops=flops,
        ),
        call_costs.fallback((lu, pivots, b), batch * n * columns * b.element_size(), flops),
    )


def lu_cost(a: torch.Tensor, *, pivot: bool = True) -> Costs:
    """getrf and its factors unpacked."""
    m, n, batch = a.shape[-2], a.shape[-1], call_costs.matrices(a.shape)
    k = min(m, n)
    factored = lu_factor_cost(a)
    written = batch * (m * m + m * k + k * n) * a.element_size()
    return Costs(
        call_costs.together(factored.device, _unpacking(a, True, True)),
        call_costs.fallback((a,), written, factored.fallback.host_flops),
    )


def reset() -> None:
    for chooser in (
        _LU_FACTOR,
        _DET,
        _SLOGDET,
        _LU_UNPACK,
        _SOLVE_TRIANGULAR,
        _INV,
        _SOLVE,
        _LU_SOLVE,
        _LU,
        _TRIANGULAR_SOLVE,
    ):
        chooser.reset()


COSTS = {
    "aten::linalg_lu_factor_ex": lu_factor_cost,
    "aten::_linalg_det": det_cost,
    "aten::_linalg_slogdet": slogdet_cost,
    "aten::lu_unpack": lu_unpack_cost,
    "aten::linalg_solve_triangular": solve_triangular_cost,
    "aten::linalg_inv_ex": inv_cost,
    "aten::_linalg_solve_ex": solve_cost,
    "aten::linalg_lu_solve": lu_solve_cost,
    "aten::linalg_lu": lu_cost,
    "aten::triangular_solve": triangular_solve_cost,
}

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
