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
The cost is 26 small kernels per column (and 6 per reflector applied), so each call takes the
composition only where the cost model prices it below DirectML's fallback for its shapes
(``COSTS``, :mod:`dmlpatch.costs.choice`): on the shipped profiles ``ormqr`` and
``householder_product`` of a few columns, a QR of a batch of hundreds of thousands, and
otherwise the fallback (``DMLPATCH_DEVICE_OPS`` keeps the composition). Matrices of more than
:data:`WIDEST` columns go through the CPU as DirectML's fallback would (counted and said as one),
as do dtypes other than float32 and float64.
"""

from __future__ import annotations

import torch

from dmlpatch.costs.choice import Chooser, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import call_costs
from dmlpatch.opfix.linalg.lu import column_major
from dmlpatch.opfix.linalg.operands import FLOATS, float_matrices, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The most columns factored on the device (reflectors are made one column at a time).
WIDEST = 64

_QR = Chooser("aten::linalg_qr")
_HOUSEHOLDER_PRODUCT = Chooser("aten::linalg_householder_product")
_GEQRF = Chooser("aten::geqrf")
_ORMQR = Chooser("aten::ormqr")


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
    if not _QR.on_device((a.shape, a.dtype, mode), lambda: qr_cost(a, mode)):
        return through_the_cpu("aten::linalg_qr.out", torch.ops.aten.linalg_qr, (a,), mode=mode)
    record("fixed", "aten::linalg_qr.out")
    return factor(a, mode)


def product(reflectors: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``orgqr``: the first ``n`` columns of ``H_1 ... H_k`` for the reflectors stored below
    the diagonal of ``reflectors`` (``(..., m, n)``, LAPACK's layout) with factors ``tau``."""
    identity = torch.zeros_like(reflectors, memory_format=torch.contiguous_format)
    identity.diagonal(dim1=-2, dim2=-1).fill_(1)
    return multiply(reflectors, tau, identity, left=True, transpose=False)


def _householder_product(reflectors: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    if (
        not float_matrices(reflectors)
        or tau.dtype != reflectors.dtype
        or tau.shape[-1] > WIDEST
        or not _HOUSEHOLDER_PRODUCT.on_device(
            (reflectors.shape, tau.shape, tau.dtype),
            lambda: householder_product_cost(reflectors, tau),
        )
    ):
        return through_the_cpu(
            "aten::linalg_householder_product",
            torch.ops.aten.linalg_householder_product,
            (reflectors, tau),
        )
    record("fixed", "aten::linalg_householder_product")
    return product(reflectors, tau)


def _geqrf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if (
        not float_matrices(a)
        or a.shape[-1] > WIDEST
        or not _GEQRF.on_device((a.shape, a.dtype), lambda: geqrf_cost(a))
    ):
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
    if not fits or not _ORMQR.on_device(
        (stored.shape, tau.shape, other.shape, other.dtype, left),
        lambda: ormqr_cost(stored, tau, other, left),
    ):
        return through_the_cpu(
            "aten::ormqr",
            torch.ops.aten.ormqr,
            (stored, tau, other),
            left=left,
            transpose=transpose,
        )
    record("fixed", "aten::ormqr")
    return column_major(multiply(stored, tau, other, left, transpose))


# What each kernel costs (:mod:`dmlpatch.opfix.linalg.call_costs`). Kernels per column of
# geqrf (:func:`lapack_qr`): the reflector (larfg's norms, signs and scaling) and its product
# with the columns on its right, 26; per reflector applied by :func:`multiply` (orgqr's Q,
# ormqr), 6. Flops are LAPACK's (Golub and Van Loan; LAPACK's dorgqr and dormqr counts).


def _reflectors(m: int, n: int) -> float:
    """The kernels of geqrf of an m x n matrix: a wide one's last column is still applied to
    the columns on its right (five kernels)."""
    return 26 * min(m, n) - 2 + (5 if n > m else 0)


def _geqrf_on_device(a: torch.Tensor) -> OnDevice:
    m, n, batch = a.shape[-2], a.shape[-1], call_costs.matrices(a.shape)
    return call_costs.composition(
        _reflectors(m, n),
        0,
        batch=batch,
        itemsize=a.element_size(),
        elements=0.075 * m * n + 0.5 * m + 2,
        flops=batch * _geqrf_flops(m, n),
    )


def _reflected(rows: int, columns: int) -> float:
    """Elements a kernel of :func:`multiply` touches per matrix: the block a reflector
    updates, half of it on average, and the reflector."""
    return 0.5 * rows * columns + 1.5 * rows


def _geqrf_flops(m: int, n: int) -> float:
    if m >= n:
        return 2 * n * n * (m - n / 3)
    return 2 * m * m * (n - m / 3)


def _orgqr_flops(m: int, n: int, k: int) -> float:
    """Forming the first n columns of Q (m rows) from k reflectors."""
    return 4 * m * n * k - 2 * (m + n) * k * k + 4 * k**3 / 3


def qr_cost(a: torch.Tensor, mode: str = "reduced") -> Costs:
    """geqrf, then Q as orgqr forms it (a complete Q of a tall matrix: its further columns
    added, two kernels)."""
    m, n, batch = a.shape[-2], a.shape[-1], call_costs.matrices(a.shape)
    k = min(m, n)
    device = _geqrf_on_device(a)
    flops = batch * _geqrf_flops(m, n)
    q_columns, r_rows = 0, k
    if mode != "r":
        q_columns = m if mode == "complete" else k
        r_rows = m if mode == "complete" else k
        q_flops = batch * _orgqr_flops(m, q_columns, k)
        forming = call_costs.composition(
            6 * k + 4 + (2 if q_columns > k else 0),
            0,
            batch=batch,
            itemsize=a.element_size(),
            elements=_reflected(m, q_columns),
            flops=q_flops,
        )
        device = call_costs.together(device, forming)
        flops += q_flops
    results = batch * (m * q_columns + r_rows * n) * a.element_size()
    return Costs(device, call_costs.fallback((a,), results, flops))


def householder_product_cost(reflectors: torch.Tensor, tau: torch.Tensor) -> Costs:
    m, n = reflectors.shape[-2], reflectors.shape[-1]
    k, batch = tau.shape[-1], call_costs.matrices(reflectors.shape)
    flops = batch * _orgqr_flops(m, n, k)
    return Costs(
        call_costs.composition(
            6 * k + 4,
            0,
            batch=batch,
            itemsize=reflectors.element_size(),
            elements=_reflected(m, n),
            flops=flops,
        ),
        call_costs.fallback(
            (reflectors, tau), reflectors.numel() * reflectors.element_size(), flops
        ),
    )


def geqrf_cost(a: torch.Tensor) -> Costs:
    m, n, batch = a.shape[-2], a.shape[-1], call_costs.matrices(a.shape)
    results = (a.numel() + batch * min(m, n)) * a.element_size()
    return Costs(
        _geqrf_on_device(a), call_costs.fallback((a,), results, batch * _geqrf_flops(m, n))
    )


def ormqr_cost(
    stored: torch.Tensor,
    tau: torch.Tensor,
    other: torch.Tensor,
    left: bool = True,
    transpose: bool = False,
) -> Costs:
    k, batch = tau.shape[-1], call_costs.matrices(other.shape)
    rows, columns = other.shape[-2], other.shape[-1]
    if not left:  # C Q is (Q^T C^T)^T
        rows, columns = columns, rows
    flops = batch * 2 * columns * k * (2 * rows - k)  # dormqr
    return Costs(
        call_costs.composition(
            6 * k + 3,
            0,
            batch=batch,
            itemsize=other.element_size(),
            elements=0.5 * rows * columns + 0.5 * rows + 2,
            flops=flops,
        ),
        call_costs.fallback((stored, tau, other), other.numel() * other.element_size(), flops),
    )


def reset() -> None:
    for chooser in (_QR, _HOUSEHOLDER_PRODUCT, _GEQRF, _ORMQR):
        chooser.reset()


COSTS = {
    "aten::linalg_qr": qr_cost,
    "aten::linalg_householder_product": householder_product_cost,
    "aten::geqrf": geqrf_cost,
    "aten::ormqr": ormqr_cost,
}

KERNELS = (
    Kernel("linalg_qr", _qr, "fallback"),
    Kernel("linalg_householder_product", _householder_product, "fallback"),
    Kernel("geqrf", _geqrf, "fallback"),
    Kernel("ormqr", _ormqr, "fallback"),
)
