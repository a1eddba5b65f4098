"""``torch.linalg.eigh``, ``eigvalsh``, ``svd`` and ``svdvals`` of small matrices on the device:
Jacobi rotations.

torch-directml 0.2.5 has no eigen- or singular-value kernel: every call copies the matrix to
the CPU and the results back (microsoft/DirectML#671), and on a GPU waits for its queue to
drain. LAPACK's tridiagonal and bidiagonal methods are long chains of scalar steps; Jacobi's
method is made of whole-matrix steps instead. The columns are paired as in a round-robin
tournament, so every round rotates ``n / 2`` disjoint pairs at once, one small matrix product
for the whole batch; ``n - 1`` rounds make a sweep, and sweeps repeat until every off-diagonal
entry is below rounding. For ``eigh`` the rotations zero ``A``'s off-diagonal pairs (the
two-sided method); for ``svd`` they make the columns of ``R`` orthogonal, where ``A = Q R``
on the device first (:mod:`dmlpatch.opfix.linalg.householder`), so that a tall matrix costs
one QR, not tall rotations (the one-sided method; ``A`` wide is ``A^T``'s).

Eigenvalues come ascending and singular values descending, as LAPACK's, and equal the CPU's
to rounding; the vectors span the same spaces, as two LAPACK builds' or a GPU's would, but
each may have the other sign (PyTorch documents that eigenvectors and singular vectors are
unique only up to sign, and that devices differ). autograd differentiates the results with
PyTorch's own formulas, which are sign-independent for the losses PyTorch accepts.

The cost: about twenty-five small kernels per round, ``n - 1`` rounds per sweep and three to
seven sweeps, with one value read back per sweep to see whether another is needed: thousands
of launches for a 32x32 matrix, against the fallback's one read-back. Each call takes the
composition only where the cost model prices it lower for its shapes (``COSTS``,
:mod:`dmlpatch.costs.choice`), which on the shipped adapter profiles no call does;
``DMLPATCH_DEVICE_OPS=aten::_linalg_eigh`` keeps it. Matrices wider than :data:`WIDEST`,
complex ones and dtypes other than float32 and float64 go through the CPU as DirectML's
fallback would (counted and said as one); ``DMLPATCH_CPU_OPS=aten::_linalg_eigh,aten::_linalg_svd``
sends all of them there.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, TypeVar

import torch

from dmlpatch.costs.choice import Chooser, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import call_costs, householder
from dmlpatch.opfix.linalg.operands import float_matrices, square, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The widest matrix decomposed on the device (eigh's ``n``, svd's smaller side).
WIDEST = householder.WIDEST
#: Sweeps before giving up on convergence (a handful suffice: convergence is quadratic).
MOST_SWEEPS = 40
#: Sweeps made before convergence is first read back: random 32x32 matrices take 5 or 6, and
#: the smaller ones that take fewer have short sweeps.
FIRST_CHECK = 3
_TRIANGLES = ("L", "U", "l", "u")
_EIGH = Chooser("aten::_linalg_eigh")
_SVD = Chooser("aten::_linalg_svd")
_Result = TypeVar("_Result")


class _Schedule:
    """The round-robin pairing of ``n`` (even) columns, built on the device once per size:
    round ``r`` pairs ``n - 1`` with ``r`` and ``r + k`` with ``r - k`` (mod ``n - 1``)."""

    def __init__(self, n: int, device: torch.device, dtype: torch.dtype) -> None:
        rounds, half = n - 1, n // 2
        r = torch.arange(rounds, device=device).unsqueeze(-1)
        k = torch.arange(1, half, device=device).unsqueeze(0)
        last = torch.full((rounds, 1), n - 1, dtype=r.dtype, device=device)
        #: ``(rounds, n / 2)``: the first and second column of each pair.
        self.first = torch.cat([last, (r + k) % rounds], dim=-1)
        self.second = torch.cat([r, (r - k) % rounds], dim=-1)
        self.flat = self.first * n + self.second
        owner = torch.cat([self.first, self.second], dim=-1)
        #: ``(rounds, n)``: where each column's value sits in ``cat([first, second])``.
        self.inverse = owner.argsort(dim=-1)
        partner = torch.cat([self.second, self.first], dim=-1).gather(-1, self.inverse)
        eye = torch.zeros(n, n, dtype=dtype, device=device)
        eye.diagonal().fill_(1)
        #: ``(rounds, n, n)``: 1 at ``(partner(j), j)``, the pair's off-diagonal entries.
        self.partners = eye.index_select(0, partner.flatten()).reshape(rounds, n, n).mT
        self.keep = 1 - self.partners
        self.rounds = rounds


@functools.lru_cache(maxsize=64)
def _schedule(n: int, device: torch.device, dtype: torch.dtype) -> _Schedule:
    return _Schedule(n, device, dtype)


def _rotation(
    schedule: _Schedule, r: int, app: torch.Tensor, aqq: torch.Tensor, apq: torch.Tensor
) -> torch.Tensor:
    """``J`` (``(..., n, n)``) of round ``r``: for each pair the rotation by the angle of at most
    45 degrees that zeroes ``a_pq`` of ``J^T A J`` (or makes columns ``p`` and ``q`` of ``A J``
    orthogonal, given their Gram entries). Column ``p`` of ``A J`` is ``c A_p - s A_q`` and
    column ``q`` is ``s A_p + c A_q``."""
    gap = aqq - app
    twice_angle = torch.atan2(torch.where(gap < 0, -apq, apq), gap.abs() * 0.5)
    angle = twice_angle * 0.5
    c, s = torch.cos(angle), torch.sin(angle)
    inverse = schedule.inverse[r]
    on_diagonal = torch.cat([c, c], dim=-1).index_select(-1, inverse)
    off_diagonal = torch.cat([-s, s], dim=-1).index_select(-1, inverse)
    return torch.diag_embed(on_diagonal) + schedule.partners[r] * off_diagonal.unsqueeze(-2)


def _pad(a: torch.Tensor) -> torch.Tensor:
    """``a`` with a zero last column (and row, if square) when its width is odd: the extra
    column pairs with no rotation (its entries stay zero) and is dropped at the end."""
    n = a.shape[-1]
    if n % 2 == 0:
        return a.contiguous()
    rows = 1 if a.shape[-2] == n else 0
    return torch.nn.functional.pad(a, (0, 1, 0, rows))


def _off_diagonal_largest(a: torch.Tensor) -> torch.Tensor:
    return (a - torch.diag_embed(a.diagonal(dim1=-2, dim2=-1))).abs().amax(dim=(-2, -1))


class _Diverged(Exception):
    """The iteration met a NaN or did not converge: the CPU says what LAPACK says of it."""


def _converged(measure: torch.Tensor, bound: torch.Tensor) -> bool:
    """Whether every matrix of the batch is done (one read back per sweep)."""
    done, lost = torch.stack([(measure <= bound).all(), measure.isnan().any()]).tolist()
    if lost:
        raise _Diverged
    return bool(done)


def diagonalise(a: torch.Tensor, compute_v: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The eigenvalues (ascending) and eigenvectors (columns) of symmetric ``a``."""
    n = a.shape[-1]
    work = _pad(a)
    size = work.shape[-1]
    schedule = _schedule(size, a.device, a.dtype)
    vectors = torch.zeros_like(work)
    vectors.diagonal(dim1=-2, dim2=-1).fill_(1)
    eps = torch.finfo(a.dtype).eps
    bound = eps * torch.linalg.vector_norm(work, dim=(-2, -1))
    for sweep in range(MOST_SWEEPS):
        if sweep >= FIRST_CHECK and _converged(_off_diagonal_largest(work), bound):
            break
        for r in range(schedule.rounds):
            diagonal = work.diagonal(dim1=-2, dim2=-1)
            app = diagonal.index_select(-1, schedule.first[r])
            aqq = diagonal.index_select(-1, schedule.second[r])
            apq = work.flatten(-2).index_select(-1, schedule.flat[r])
            j = _rotation(schedule, r, app, aqq, apq)
            # The pair's own entries are zero in exact arithmetic; setting them so keeps
            # rounding from holding the sweeps above the bound.
            work = (j.mT @ work @ j) * schedule.keep[r]
            if compute_v:
                vectors = vectors @ j
    else:
        raise _Diverged
    values = work.diagonal(dim1=-2, dim2=-1)[..., :n]
    values, order = values.sort(dim=-1, stable=True)
    if not compute_v:
        return values, a.new_empty(0)
    vectors = vectors[..., :n, :n]
    vectors = vectors.gather(-1, order.unsqueeze(-2).expand(vectors.shape))
    return values, vectors


def _orthogonalise(w: torch.Tensor, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One-sided Jacobi on square ``w``: ``(W V, V)`` with ``W V``'s columns orthogonal."""
    m = w.shape[-2]
    schedule = _schedule(w.shape[-1], w.device, w.dtype)
    eps = torch.finfo(w.dtype).eps
    tolerance = max(m, 4) * eps
    for sweep in range(MOST_SWEEPS):
        gram = w.mT @ w
        if sweep >= FIRST_CHECK:
            norms = gram.diagonal(dim1=-2, dim2=-1).sqrt()
            scale = norms.unsqueeze(-1) * norms.unsqueeze(-2)
            if _converged(_off_diagonal_largest(gram), tolerance * scale.amax(dim=(-2, -1))):
                break
        for r in range(schedule.rounds):
            if r:
                gram = w.mT @ w
            diagonal = gram.diagonal(dim1=-2, dim2=-1)
            alpha = diagonal.index_select(-1, schedule.first[r])
            beta = diagonal.index_select(-1, schedule.second[r])
            gamma = gram.flatten(-2).index_select(-1, schedule.flat[r])
            j = _rotation(schedule, r, alpha, beta, gamma)
            w = w @ j
            vectors = vectors @ j
    else:
        raise _Diverged
    return w, vectors


def _unit_columns(columns: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns from orthogonal ones (their ``lengths``), completed by QR on the
    device where a column is zero, as LAPACK's are orthonormal."""
    safe = torch.where(lengths > 0, lengths, torch.ones_like(lengths))
    scaled = columns * torch.where(lengths > 0, 1 / safe, torch.zeros_like(lengths)).unsqueeze(-2)
    q, r = householder.factor(scaled, "reduced")
    signs = torch.where(r.diagonal(dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(q.dtype)
    return q * signs.unsqueeze(-2)


def decompose(
    a: torch.Tensor, full_matrices: bool, compute_uv: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(U, S, Vh)`` of real ``a`` (``(..., m, n)``), as ``torch.linalg.svd``."""
    m, n = a.shape[-2], a.shape[-1]
    if m < n:
        u, s, vh = decompose(a.mT, full_matrices, compute_uv)
        return (vh.mT, s, u.mT) if compute_uv else (u, s, vh)
    q, r = householder.factor(a, "complete" if full_matrices and compute_uv else "reduced")
    square = _pad(r.triu() if r.shape[-2] == n else r[..., :n, :])
    vectors = torch.zeros_like(square)
    vectors.diagonal(dim1=-2, dim2=-1).fill_(1)
    w, vectors = _orthogonalise(square, vectors)
    w, vectors = w[..., :n, :n], vectors[..., :n, :n]
    lengths = torch.linalg.vector_norm(w, dim=-2)
    values, order = lengths.sort(dim=-1, descending=True, stable=True)
    if not compute_uv:
        return a.new_empty(0), values, a.new_empty(0)
    w = w.gather(-1, order.unsqueeze(-2).expand(w.shape))
    vectors = vectors.gather(-1, order.unsqueeze(-2).expand(vectors.shape))
    u_of_r = _unit_columns(w, values)
    u = q[..., :n] @ u_of_r
    if full_matrices:
        u = torch.cat([u, q[..., n:]], dim=-1)
    return u, values, vectors.mT.contiguous()


def _decomposable(a: torch.Tensor, width: int) -> bool:
    return float_matrices(a) and within(width, WIDEST)


def _eigh(
    a: torch.Tensor, uplo: str = "L", compute_v: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    attempt = None
    if (
        _decomposable(a, a.shape[-1])
        and square(a)
        and uplo in _TRIANGLES
        and _EIGH.on_device((a.shape, a.dtype, compute_v), lambda: eigh_cost(a, uplo, compute_v))
    ):
        # LAPACK reads one triangle only.
        lower = a.tril() if uplo in "Ll" else a.mT.tril()
        attempt = functools.partial(diagonalise, lower + lower.tril(-1).mT, compute_v)
    name = "aten::_linalg_eigh.eigenvalues"
    options = {"UPLO": uplo, "compute_v": compute_v}
    return _served(name, torch.ops.aten._linalg_eigh, a, attempt, options)


def _svd(
    a: torch.Tensor,
    full_matrices: bool = False,
    compute_uv: bool = True,
    *,
    driver: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    attempt = None
    if (
        driver is None
        and _decomposable(a, min(a.shape[-2:], default=0))
        and _SVD.on_device(
            (a.shape, a.dtype, full_matrices, compute_uv),
            lambda: svd_cost(a, full_matrices, compute_uv),
        )
    ):
        attempt = functools.partial(decompose, a, full_matrices, compute_uv)
    options = {"full_matrices": full_matrices, "compute_uv": compute_uv, "driver": driver}
    return _served("aten::_linalg_svd.U", torch.ops.aten._linalg_svd, a, attempt, options)


def _served(
    name: str,
    op: Any,
    a: torch.Tensor,
    attempt: Optional[Callable[[], _Result]],
    options: dict[str, Any],
) -> _Result:
    """``attempt`` on the device, counted as fixed; through the CPU where there is none (the
    call is not one the device takes) or it diverged (a NaN: the CPU says what LAPACK says)."""
    if attempt is not None:
        try:
            result = attempt()
        except _Diverged:
            pass
        else:
            record("fixed", name)
            return result
    answer: _Result = through_the_cpu(name, op, (a,), **options)
    return answer


def typical_sweeps(n: int, batch: int) -> float:
    """Sweeps a batch of matrices of width ``n`` typically takes (the iteration stops when
    every matrix has converged, which the data decide): counted on random matrices, 3 to 4 of
    width 4, 4 to 5 of 8, 5 to 6 of 16, 6 of 32, 7 of 64; a batch takes its slowest matrix's,
    about half a sweep more."""
    return max(float(FIRST_CHECK), math.log2(n) + 1.5) + (0.5 if batch > 1 else 0.0)


def _checks(sweeps: float) -> float:
    """Convergence read back after every sweep from :data:`FIRST_CHECK` on."""
    return sweeps - FIRST_CHECK + 1


def eigh_cost(a: torch.Tensor, uplo: str = "L", compute_v: bool = True) -> Costs:
    """Per round, the rotation (about twenty kernels) and its products with ``A`` (and with
    the vectors): 25 kernels, 26 with vectors; ten per convergence check; one sweep is
    ``n - 1`` rounds of the padded width. Sweeps: :func:`typical_sweeps`."""
    n, batch = a.shape[-1], call_costs.matrices(a.shape)
    width = n + n % 2
    sweeps = typical_sweeps(n, batch)
    per_round = 25 + int(compute_v)
    launches = 9 + 2 * (n % 2) + sweeps * (width - 1) * per_round + 10 * _checks(sweeps)
    # Each round's products: J^T A J, and V J.
    flops = batch * sweeps * (width - 1) * (2 + int(compute_v)) * 2 * width**3
    # syevd: 9 n^3 with the vectors, 4 n^3 / 3 for the values alone (Golub and Van Loan).
    host_flops = batch * (9 * n**3 if compute_v else 4 * n**3 / 3)
    results = batch * (n + (n * n if compute_v else 0)) * a.element_size()
    return Costs(
        call_costs.composition(
            launches,
            _checks(sweeps),
            batch=batch,
            itemsize=a.element_size(),
            elements=(0.7 if compute_v else 0.5) * width * width,
            flops=flops,
        ),
        call_costs.fallback((a,), results, host_flops),
    )


def svd_cost(
    a: torch.Tensor,
    full_matrices: bool = False,
    compute_uv: bool = True,
    *,
    driver: str | None = None,
) -> Costs:
    """QR of the tall side (:func:`householder.qr_cost`, 32 kernels a column), one-sided
    Jacobi on R (25 kernels a round, 14 per convergence check) and, with the vectors, U's
    columns made orthonormal by a second QR of R's width."""
    m, n, batch = a.shape[-2], a.shape[-1], call_costs.matrices(a.shape)
    k, tall = min(m, n), max(m, n)
    width = k + k % 2
    sweeps = typical_sweeps(k, batch)
    rotations = sweeps * (width - 1) * 25 + 14 * _checks(sweeps) + 2 * (k % 2)
    if compute_uv:
        launches = 64 * k + 28 + rotations
        if full_matrices:
            launches += 1 + (2 if tall > k else 0)
    else:
        launches = 32 * k + 8 + rotations
    # The QR of the tall side, then per round W^T W, W J and V J.
    flops = batch * (2 * tall * k * k + sweeps * (width - 1) * 3 * 2 * width**3)
    # gesdd by R-SVD (Golub and Van Loan): the values alone 4 m n^2 - 4 n^3 / 3; thin
    # vectors 6 m n^2 + 11 n^3; a complete U 4 m^2 n + 22 n^3 (m the tall side).
    if not compute_uv:
        host_flops = 4 * tall * k * k - 4 * k**3 / 3
        vectors = 0
    elif full_matrices:
        host_flops = 4 * tall * tall * k + 22 * k**3
        vectors = m * m + n * n
    else:
        host_flops = 6 * tall * k * k + 11 * k**3
        vectors = (m + n) * k
    results = batch * (k + vectors) * a.element_size()
    return Costs(
        call_costs.composition(
            launches,
            _checks(sweeps),
            batch=batch,
            itemsize=a.element_size(),
            elements=0.5 * width * width + 0.15 * tall * k,
            flops=flops,
        ),
        call_costs.fallback((a,), results, batch * host_flops),
    )


def reset() -> None:
    _EIGH.reset()
    _SVD.reset()


COSTS = {"aten::_linalg_eigh": eigh_cost, "aten::_linalg_svd": svd_cost}

KERNELS = (
    Kernel("_linalg_eigh", _eigh, "fallback"),
    Kernel("_linalg_svd", _svd, "fallback"),
)
