"""``torch.linalg.lstsq`` of full-rank systems on the device: QR, then a triangular solve.

torch-directml 0.2.5 has no least-squares kernel: every call copies A and B to the CPU and the
solution back, where LAPACK's ``gelsy`` (the CPU's default driver, and so DirectML's) solves
it: QR with column pivoting, the rank decided by a condition estimate against ``rcond``, and
the minimum-norm solution. For a matrix of full rank that solution is unique, and here it is
computed on the device: ``A = Q R`` (:mod:`dmlpatch.opfix.linalg.householder`) and
``x = R^-1 Q^T b`` for a tall A; ``A^T = Q R`` and ``x = Q R^-T b`` (the minimum norm) for a
wide one. ``rank`` is ``min(m, n)``, and ``residuals`` and ``singular_values`` are empty, as
``gelsy`` returns them. The other drivers' solution of a full-rank system is the same; what
they return beside it is theirs: ``gels`` (CUDA's driver, which reads no ``rcond``) an empty
rank and the residuals of a tall system, ``gelsd`` and ``gelss`` the singular values (the
device's SVD, :mod:`dmlpatch.opfix.linalg.jacobi`), whose ratio to the largest proves the
rank, and the residuals.

Full rank is proved, not assumed: ``||R||_F ||R^-1||_F`` bounds the condition number from
above, and only where it is a hundred times below ``1 / rcond`` (gelsy's estimate can only be
lower) does the device answer; that bound is the one value read back per call. The
composition is 42 kernels a column, so each call takes it only where the cost model prices it
below DirectML's fallback for its shapes (``COSTS``, :mod:`dmlpatch.costs.choice`): on the
shipped adapter profiles, batches of about a million small systems; ``DMLPATCH_DEVICE_OPS``
keeps it. A
rank-deficient or ill-conditioned system, broadcast batches, complex and
half dtypes and matrices of more than :data:`WIDEST` columns go through the CPU, as DirectML's
fallback would, counted and said as one.
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.costs.choice import Chooser, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import call_costs, householder, jacobi, lu
from dmlpatch.opfix.linalg.operands import float_matrices, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The widest system solved on the device (``min(m, n)``: QR's reflectors, one per column).
WIDEST = householder.WIDEST
#: How far below ``1 / rcond`` the condition bound must be for the rank to be surely full.
MARGIN = 100.0
#: The drivers served: ``gelsy`` (the CPU's default), ``gels`` (CUDA's), ``gelsd``, ``gelss``.
_DRIVERS = (None, "gelsy", "gels", "gelsd", "gelss")

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

_LSTSQ = Chooser("aten::linalg_lstsq")


def _shaped_for_the_device(a: torch.Tensor, b: torch.Tensor) -> Optional[torch.Tensor]:
    """``b`` as a batch of matrices matching ``a``'s batch, or None where the device path
    does not take the call (PyTorch's checks and broadcasting are the CPU's to make)."""
    if not float_matrices(a) or b.dtype != a.dtype or not within(min(a.shape[-2:]), WIDEST):
        return None
    if b.dim() == a.dim() - 1 and b.shape == a.shape[:-1]:
        return b.unsqueeze(-1)
    if b.dim() == a.dim() and b.shape[:-1] == a.shape[:-1] and b.shape[-1] > 0:
        return b
    return None


def _condition_bound(r: torch.Tensor) -> torch.Tensor:
    """``||R||_F ||R^-1||_F`` per matrix: at least R's 2-norm condition number."""
    identity = torch.zeros_like(r)
    identity.diagonal(dim1=-2, dim2=-1).fill_(1)
    inverse = lu.triangular(r, identity, upper=True, unitriangular=False)
    norms = torch.linalg.vector_norm(r, dim=(-2, -1))
    inverse_norms = torch.linalg.vector_norm(inverse, dim=(-2, -1))
    bound = norms * inverse_norms
    return torch.where(bound.isfinite(), bound, torch.full_like(bound, float("inf")))


def solve(a: torch.Tensor, b: torch.Tensor, rcond: float) -> Optional[torch.Tensor]:
    """The least-squares solution of full-rank ``a``, or None where full rank is not proved."""
    return _solution(a, b, proof=rcond)


def _solution(a: torch.Tensor, b: torch.Tensor, proof: Optional[float]) -> Optional[torch.Tensor]:
    """``R^-1 Q^T b`` (``Q R^-T b`` for a wide ``a``); with ``proof``, None unless the
    condition bound shows the rank full against that ``rcond``."""
    m, n = a.shape[-2], a.shape[-1]
    tall = m >= n
    q, r = householder.factor(a if tall else a.mT, "reduced")
    if proof is not None and float(_condition_bound(r).amax()) * proof * MARGIN >= 1.0:
        return None
    if tall:
        return lu.triangular(r, q.mT @ b, upper=True, unitriangular=False)
    return q @ lu.triangular(r.mT, b, upper=False, unitriangular=False)


def _by_driver(
    a: torch.Tensor, b: torch.Tensor, rcond: Optional[float], driver: Optional[str]
) -> Optional[Result]:
    """What ``driver`` returns for a system of full rank, or None where that is not proved."""
    m, n = a.shape[-2], a.shape[-1]
    default = torch.finfo(a.dtype).eps * max(m, n)
    threshold = rcond if rcond is not None else default
    nothing = a.new_empty(0)
    if driver in ("gelsd", "gelss"):
        if threshold <= 0:
            return None
        # Their rank counts the singular values above rcond times the largest: those values
        # are computed here anyway (they are returned), so they prove the rank themselves.
        values = torch.linalg.svdvals(a)
        if not float((values[..., -1] / values[..., 0]).amin()) >= threshold * MARGIN:
            return None
        solution = _solution(a, b, proof=None)
        rank = torch.full(a.shape[:-2], min(m, n), dtype=torch.int64, device=a.device)
    elif driver == "gels":  # LAPACK's QR, which takes the rank as full: rcond is not read
        solution = _solution(a, b, proof=default)
        rank, values = torch.empty(0, dtype=torch.int64, device=a.device), nothing
    else:
        solution = _solution(a, b, proof=threshold) if threshold > 0 else None
        rank = torch.full(a.shape[:-2], min(m, n), dtype=torch.int64, device=a.device)
        values = nothing
    if solution is None:
        return None
    residuals = nothing
    if m > n and driver in ("gels", "gelsd", "gelss"):
        residuals = (a @ solution - b).square().sum(-2)
    return solution, residuals, rank, values


def _lstsq(
    a: torch.Tensor, b: torch.Tensor, rcond: Optional[float] = None, *, driver: Optional[str] = None
) -> Result:
    matrices = _shaped_for_the_device(a, b) if driver in _DRIVERS else None
    if matrices is not None and not _LSTSQ.on_device(
        (a.shape, matrices.shape, a.dtype, driver), lambda: lstsq_cost(a, b, rcond, driver=driver)
    ):
        matrices = None
    answer = _by_driver(a, matrices, rcond, driver) if matrices is not None else None
    if answer is None:
        return through_the_cpu(
            "aten::linalg_lstsq.out", torch.ops.aten.linalg_lstsq, (a, b, rcond), driver=driver
        )
    record("fixed", "aten::linalg_lstsq.out")
    solution, residuals, rank, values = answer
    return (solution if matrices is b else solution.squeeze(-1)), residuals, rank, values


def lstsq_cost(
    a: torch.Tensor, b: torch.Tensor, rcond: Optional[float] = None, *, driver: Optional[str] = None
) -> Costs:
    """QR (32 kernels a column), the condition bound (a triangular inverse: five a row, and
    the one read-back) and the solve: 42 kernels a column. ``gels`` adds a tall system's
    residuals (four); ``gelsd`` and ``gelss`` prove the rank with the device's singular values
    (:func:`jacobi.svd_cost`), read back, instead of the bound."""
    m, n, batch = a.shape[-2], a.shape[-1], call_costs.matrices(a.shape)
    k, tall = min(m, n), max(m, n)
    columns = b.shape[-1] if b.dim() == a.dim() else 1
    residuals_made = 4 if m > n else 0
    # Householder QR (gelsy pivots its columns too), then Q^T b and the triangular solve.
    host_flops = 2 * k * k * (tall - k / 3) + 4 * tall * k * columns
    if driver in ("gelsd", "gelss"):
        launches, readbacks = 37 * k + 5 + residuals_made, 1
        host_flops += 4 * tall * k * k + 8 * k**3  # and the SVD (Golub and Van Loan)
    elif driver == "gels":
        launches, readbacks = 42 * k + 11 + residuals_made, 1
    else:
        launches, readbacks = 42 * k + 12, 1
    solving = call_costs.composition(
        launches,
        readbacks,
        batch=batch,
        itemsize=a.element_size(),
        elements=0.15 * tall * k + tall,
        flops=batch * host_flops,
    )
    if driver in ("gelsd", "gelss"):
        singular_values = jacobi.svd_cost(a, compute_uv=False).device
        solving = call_costs.together(singular_values, solving)
    # The solution; a tall system's residuals (but gelsy's); the rank (but gels'); the
    # singular values (gelsd's and gelss').
    returned = k if driver in ("gelsd", "gelss") else 0
    residuals = columns if m > n and driver in ("gels", "gelsd", "gelss") else 0
    rank = 0 if driver == "gels" else 8
    results = batch * ((n * columns + residuals + returned) * a.element_size() + rank)
    return Costs(solving, call_costs.fallback((a, b), results, batch * host_flops))


def reset() -> None:
    _LSTSQ.reset()


COSTS = {"aten::linalg_lstsq": lstsq_cost}

KERNELS = (Kernel("linalg_lstsq", _lstsq, "fallback"),)
