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

No step reads a value back to the host: a zero column is handled by selection, not a branch.
The cost is about a dozen small kernels per column, so matrices of more than
:data:`WIDEST` columns go through the CPU as DirectML's fallback would (counted and said as one),
as do dtypes other than float32 and float64.
"""

from __future__ import annotations

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The most columns factored on the device (reflectors are made one column at a time).
WIDEST = 64
_FLOATS = (torch.float32, torch.float64)


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


def factor(a: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    """``(Q, R)`` of ``a`` (``(..., m, n)``) on its device, as ``torch.linalg.qr``."""
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    r = a.clone(memory_format=torch.contiguous_format)
    reflectors = []
    for j in range(k):
        v, tau, beta = _reflector(r[..., j:, j])
        if j + 1 < n:
            r[..., j:, j + 1 :] = _reflect(r[..., j:, j + 1 :], v, tau)
        r[..., j, j] = beta
        r[..., j + 1 :, j] = 0
        reflectors.append((v, tau))
    columns = m if mode == "complete" else k
    rows_of_r = m if mode == "complete" else k
    big_r = r[..., :rows_of_r, :].triu()
    if mode == "r":
        return torch.empty(0, dtype=a.dtype, device=a.device), big_r
    q = torch.zeros(*a.shape[:-2], m, columns, dtype=a.dtype, device=a.device)
    q.diagonal(dim1=-2, dim2=-1).fill_(1)
    for j in range(k - 1, -1, -1):
        v, tau = reflectors[j]
        q[..., j:, :] = _reflect(q[..., j:, :], v, tau)
    return q, big_r


def _qr(a: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    if a.dtype not in _FLOATS or a.dim() < 2 or a.shape[-1] > WIDEST or a.numel() == 0:
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
    q = torch.zeros_like(reflectors, memory_format=torch.contiguous_format)
    q.diagonal(dim1=-2, dim2=-1).fill_(1)
    one = torch.ones_like(reflectors[..., :1, 0])
    for j in range(tau.shape[-1] - 1, -1, -1):
        v = torch.cat([one, reflectors[..., j + 1 :, j]], dim=-1)
        q[..., j:, :] = _reflect(q[..., j:, :], v, tau[..., j])
    return q


def _householder_product(reflectors: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    if (
        reflectors.dtype not in _FLOATS
        or tau.dtype != reflectors.dtype
        or reflectors.dim() < 2
        or tau.shape[-1] > WIDEST
        or reflectors.numel() == 0
    ):
        return through_the_cpu(
            "aten::linalg_householder_product",
            torch.ops.aten.linalg_householder_product,
            (reflectors, tau),
        )
    record("fixed", "aten::linalg_householder_product")
    return product(reflectors, tau)


KERNELS = (
    Kernel("linalg_qr", _qr, "fallback"),
    Kernel("linalg_householder_product", _householder_product, "fallback"),
)
