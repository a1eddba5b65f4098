"""``torch.linalg.qr`` on the device: Householder reflections, as LAPACK's ``geqrf`` and
``orgqr`` make them on the CPU.

torch-directml 0.2.5 has no QR kernel: every call copies the matrix to the CPU and Q and R back
(microsoft/DirectML#671), and on a GPU waits for its queue to drain. Here each column ``j``
becomes a reflector ``H = I - tau v v^T`` chosen as LAPACK's ``larfg`` chooses it
(``beta = -sign(alpha) * ||x||``, ``v[0] = 1``, ``tau = 0`` where the column below the
diagonal is already zero), applied to the columns on its right; Q is the product of the
reflectors, accumulated from the last as ``orgqr`` does. Q and R are then LAPACK's, to the
rounding of the order of the sums, in every mode (``reduced``, ``complete``, ``r``) and batch.
autograd differentiates the result with PyTorch's own formula (``linalg_qr_backward``).
The same reflectors serve ``torch.geqrf`` (in LAPACK's column-major layout, as the CPU returns
them), ``torch.ormqr`` (multiplying by Q or Q^T, on either side, without forming Q) and
``householder_product`` (``orgqr``, the parametrizations' orthogonal map).

No step reads a value back to the host: a zero column is handled by selection, not a branch.
The cost is about a dozen small kernels per column, so matrices of more than
:data:`WIDEST` columns go through the CPU as DirectML's fallback would (counted and said as one),
as do dtypes other than float32 and float64.
"""

from __future__ import annotations

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg.lu import column_major
from dmlpatch.opfix.linalg.operands import FLOATS, float_matrices, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The most columns factored on the device (reflectors are made one column at a time).
WIDEST = 64


def _reflector(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``larfg`` over a batch of columns ``x`` (``(..., rows)``): ``(v, tau, beta)``."""
    alpha = x[..., 0]
    below = x[..., 1:]
    untouched = torch.linalg.vector_norm(below, dim=-1) == 0
    # -sign(alpha) * hypot(alpha, ||below||), with what DirectML has (no hypot, no copysign).
    length = torch.linalg.vector_norm(x, dim=-1)
    beta = torch.where(alpha < 0, length, -length)
    beta = torch.where(untouched, alpha, beta)
    safe_beta = torch.where(untouched, torch.ones_like(beta), beta)
    tau = torch.where(untouched, torch.zeros_like(beta), (beta - alpha) / safe_beta)
    scale = torch.where(untouched, torch.ones_like(beta), alpha - beta)
    v = torch.cat([torch.ones_like(alpha).unsqueeze(-1), below / scale.unsqueeze(-1)], dim=-1)
    return v, tau, beta


def _reflect(block: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``H @ block`` for ``H = I - tau v v^T``, batched."""
    projected = v.unsqueeze(-2) @ block  # (..., 1, columns)
    return block - (tau.unsqueeze(-1) * v).unsqueeze(-1) * projected


def lapack_qr(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``geqrf``: ``(R and the reflectors, tau)`` of ``a`` (``(..., m, n)``) in LAPACK's
    layout, R on and above the diagonal, each reflector's ``v`` below it (its leading 1
    implied)."""
    m, n = a.shape[-2], a.shape[-1]
    r = a.clone(memory_format=torch.contiguous_format)
    taus = []
    for j in range(min(m, n)):
        v, tau, beta = _reflector(r[..., j:, j])
        if j + 1 < n:
            r[..., j:, j + 1 :] = _reflect(r[..., j:, j + 1 :], v, tau)
        r[..., j, j] = beta
        r[..., j + 1 :, j] = v[..., 1:]
        taus.append(tau)
    tau = torch.stack(taus, dim=-1) if taus else a.new_zeros(*a.shape[:-2], 0)
    return r, tau


def factor(a: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    """``(Q, R)`` of ``a`` (``(..., m, n)``) on its device, as ``torch.linalg.qr``."""
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    r, tau = lapack_qr(a)
    rows_of_r = m if mode == "complete" else k
    big_r = r[..., :rows_of_r, :].triu()
    if mode == "r":
        return torch.empty(0, dtype=a.dtype, device=a.device), big_r
    columns = m if mode == "complete" else k
    stored = r[..., :, :k]
    if columns > k:  # Q's further columns are the identity's, which no reflector reaches
        stored = torch.cat([stored, stored.new_zeros(*stored.shape[:-1], columns - k)], dim=-1)
    return product(stored, tau), big_r


def _qr(a: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    if not float_matrices(a) or a.shape[-1] > WIDEST:
        return through_the_cpu("aten::linalg_qr.out", torch.ops.aten.linalg_qr, (a,), mode=mode)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(
            f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), "
            "'r', or 'complete'"
        )
    record("fixed", "aten::linalg_qr.out")
    return factor(a, mode)


def product(reflectors: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``orgqr``: the first ``n`` columns of ``H_1 ... H_k`` for the reflectors stored below
    the diagonal of ``reflectors`` (``(..., m, n)``, LAPACK's layout) with factors ``tau``."""
    identity = torch.zeros_like(reflectors, memory_format=torch.contiguous_format)
    identity.diagonal(dim1=-2, dim2=-1).fill_(1)
    return multiply(reflectors, tau, identity, left=True, transpose=False)


def _householder_product(reflectors: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    if not float_matrices(reflectors) or tau.dtype != reflectors.dtype or tau.shape[-1] > WIDEST:
        return through_the_cpu(
            "aten::linalg_householder_product",
            torch.ops.aten.linalg_householder_product,
            (reflectors, tau),
        )
    record("fixed", "aten::linalg_householder_product")
    return product(reflectors, tau)


def _geqrf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not float_matrices(a) or a.shape[-1] > WIDEST:
        return through_the_cpu("aten::geqrf", torch.ops.aten.geqrf, (a,))
    record("fixed", "aten::geqrf")
    r, tau = lapack_qr(a)
    return column_major(r), tau


def multiply(
    stored: torch.Tensor, tau: torch.Tensor, other: torch.Tensor, left: bool, transpose: bool
) -> torch.Tensor:
    """``ormqr``: ``other`` multiplied by Q (Q^T when ``transpose``), on the left or the right,
    for Q ``H_1 ... H_k`` stored as :func:`lapack_qr` stores it."""
    out = other.clone(memory_format=torch.contiguous_format)
    if not left:  # C Q = (Q^T C^T)^T
        out = out.mT
    one = torch.ones_like(stored[..., :1, 0])
    # Q C applies H_k first; Q^T C applies H_1 first (each H is its own transpose).
    last_first = left != transpose
    order = range(tau.shape[-1] - 1, -1, -1) if last_first else range(tau.shape[-1])
    for j in order:
        v = torch.cat([one, stored[..., j + 1 :, j]], dim=-1)
        out[..., j:, :] = _reflect(out[..., j:, :], v, tau[..., j])
    return out if left else out.mT


def _ormqr(
    stored: torch.Tensor,
    tau: torch.Tensor,
    other: torch.Tensor,
    left: bool = True,
    transpose: bool = False,
) -> torch.Tensor:
    fits = (
        stored.dtype in FLOATS
        and tau.dtype == other.dtype == stored.dtype
        and stored.dim() >= 2
        and other.dim() == stored.dim()
        and stored.shape[:-2] == other.shape[:-2] == tau.shape[:-1]
        and within(tau.shape[-1], min(WIDEST, *stored.shape[-2:]))
        and stored.shape[-2] == other.shape[-2 if left else -1]
    )
    if not fits:
        return through_the_cpu(
            "aten::ormqr",
            torch.ops.aten.ormqr,
            (stored, tau, other),
            left=left,
            transpose=transpose,
        )
    record("fixed", "aten::ormqr")
    return column_major(multiply(stored, tau, other, left, transpose))


KERNELS = (
    Kernel("linalg_qr", _qr, "fallback"),
    Kernel("linalg_householder_product", _householder_product, "fallback"),
    Kernel("geqrf", _geqrf, "fallback"),
    Kernel("ormqr", _ormqr, "fallback"),
)
