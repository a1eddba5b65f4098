"""``torch.linalg.lstsq`` of full-rank systems on the device: QR, then a triangular solve.

torch-directml 0.2.5 has no least-squares kernel: every call copies A and B to the CPU and the
solution back, where LAPACK's ``gelsy`` (the CPU's default driver, and so DirectML's) solves
it: QR with column pivoting, the rank decided by a condition estimate against ``rcond``, and
the minimum-norm solution. For a matrix of full rank that solution is unique, and here it is
computed on the device: ``A = Q R`` (:mod:`dmlpatch.opfix.linalg.householder`) and
``x = R^-1 Q^T b`` for a tall A; ``A^T = Q R`` and ``x = Q R^-T b`` (the minimum norm) for a
wide one. ``rank`` is ``min(m, n)``, and ``residuals`` and ``singular_values`` are empty, as
``gelsy`` returns them.

Full rank is proved, not assumed: ``||R||_F ||R^-1||_F`` bounds the condition number from
above, and only where it is a hundred times below ``1 / rcond`` (gelsy's estimate can only be
lower) does the device answer; that bound is the one value read back per call. A
rank-deficient or ill-conditioned system, another driver, broadcast batches, complex and
half dtypes and matrices of more than :data:`WIDEST` columns go through the CPU, as DirectML's
fallback would, counted and said as one.
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import householder, lu
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The widest system solved on the device (``min(m, n)``: QR's reflectors, one per column).
WIDEST = householder.WIDEST
#: How far below ``1 / rcond`` the condition bound must be for the rank to be surely full.
MARGIN = 100.0
_FLOATS = (torch.float32, torch.float64)

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _shaped_for_the_device(a: torch.Tensor, b: torch.Tensor) -> Optional[torch.Tensor]:
    """``b`` as a batch of matrices matching ``a``'s batch, or None where the device path
    does not take the call (PyTorch's checks and broadcasting are the CPU's to make)."""
    if a.dim() < 2 or a.dtype not in _FLOATS or b.dtype != a.dtype or a.numel() == 0:
        return None
    if not 0 < min(a.shape[-2:]) <= WIDEST:
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
    m, n = a.shape[-2], a.shape[-1]
    tall = m >= n
    q, r = householder.factor(a if tall else a.mT, "reduced")
    if float(_condition_bound(r).amax()) * rcond * MARGIN >= 1.0:
        return None
    if tall:
        return lu.triangular(r, q.mT @ b, upper=True, unitriangular=False)
    return q @ lu.triangular(r.mT, b, upper=False, unitriangular=False)


def _lstsq(
    a: torch.Tensor, b: torch.Tensor, rcond: Optional[float] = None, *, driver: Optional[str] = None
) -> Result:
    matrices = _shaped_for_the_device(a, b) if driver in (None, "gelsy") else None
    if matrices is not None:
        m, n = a.shape[-2], a.shape[-1]
        threshold = rcond if rcond is not None else torch.finfo(a.dtype).eps * max(m, n)
        solution = solve(a, matrices, threshold) if threshold > 0 else None
        if solution is not None:
            record("fixed", "aten::linalg_lstsq.out")
            if matrices is not b:
                solution = solution.squeeze(-1)
            rank = torch.full(a.shape[:-2], min(m, n), dtype=torch.int64, device=a.device)
            return solution, a.new_empty(0), rank, a.new_empty(0)
    return through_the_cpu(
        "aten::linalg_lstsq.out", torch.ops.aten.linalg_lstsq, (a, b, rcond), driver=driver
    )


KERNELS = (Kernel("linalg_lstsq", _lstsq, "fallback"),)
