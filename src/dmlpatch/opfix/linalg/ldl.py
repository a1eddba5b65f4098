"""``torch.linalg.ldl_factor`` and ``ldl_solve`` on the device: Bunch-Kaufman pivoting, as
LAPACK's ``sytf2`` and ``sytrs`` do it on the CPU.

torch-directml 0.2.5 has no kernel for either: each call copies through the CPU and, on a
GPU, waits for its queue to drain. A symmetric indefinite matrix is factored ``P L D L^T P^T``
with D made of 1x1 and 2x2 blocks, and which block comes next depends on each matrix's
numbers: ``sytf2`` compares the diagonal entry with the column's largest entry and that
entry's row (``alpha = (1 + sqrt(17)) / 8``), takes a 1x1 pivot, swaps one in, or takes a 2x2
block. So that no step reads a value back to the host and a batch moves together, column
``j`` is one step for every matrix: each makes its own choice, and a matrix whose column
``j`` was the second of a 2x2 block taken at ``j - 1`` passes; the choices, the symmetric
interchange of the trailing matrix and both updates are computed for all and selected per
matrix. ``LD``, ``pivots`` (1-based, negative for a 2x2 block) and ``info`` are LAPACK's, in
its column-major layout with the upper triangle zero, as the CPU returns them. The solve
undoes the interchanges in the order ``sytrs`` does, one column at a time likewise.

The trailing update is a whole-matrix product per column, so matrices up to :data:`WIDEST`
columns are factored here; wider ones, complex ones and matrices holding an infinity or a
NaN (one value read back per factorisation: LAPACK's choices on them are its own) go through
the CPU as DirectML's fallback would, counted and said as one. The solve reads nothing back.
About a hundred kernels a column (sixty for the solve) cost more than the fallback's read-back
for every shape but a 1x1 solve on the shipped adapter profiles, so each call takes the
composition only where the cost model prices it lower (``COSTS``, :mod:`dmlpatch.costs.choice`);
``DMLPATCH_DEVICE_OPS`` keeps it.
"""

from __future__ import annotations

import math

import torch

from dmlpatch.costs.choice import Chooser, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import call_costs
from dmlpatch.opfix.linalg.lu import column_major, first_flagged, swap_rows
from dmlpatch.opfix.linalg.operands import FLOATS, square_floats, within
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The widest matrix factored on the device.
WIDEST = 64
#: Bunch and Kaufman's threshold: it bounds the growth of the entries of L and D.
_ALPHA = (1 + math.sqrt(17)) / 8

_FACTOR = Chooser("aten::linalg_ldl_factor_ex")
_SOLVE = Chooser("aten::linalg_ldl_solve")


def _row(s: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Row ``index`` (a batch of indices) of each matrix of ``s``."""
    m = s.shape[-1]
    return s.gather(-2, index.reshape(*index.shape, 1, 1).expand(*index.shape, 1, m)).squeeze(-2)


def _pick(flags: torch.Tensor, chosen: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``chosen`` where ``flags`` (one per matrix), ``other`` elsewhere."""
    return torch.where(
        flags.reshape(*flags.shape, *(1,) * (chosen.dim() - flags.dim())), chosen, other
    )


def factor(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sytrf`` of the lower triangle of ``a`` (``(..., n, n)``): ``(LD, pivots, info)``."""
    n = a.shape[-1]
    batch = a.shape[:-2]
    lower = a.tril()
    # The trailing matrix is kept whole (both triangles) so that a row is as easy to read as a
    # column; the columns already factored are read only below their diagonal.
    w = (lower + lower.tril(-1).mT).contiguous()
    pivots = torch.zeros(*batch, n, dtype=torch.int32, device=a.device)
    passing = torch.zeros(batch, dtype=torch.bool, device=a.device)
    singular = []
    for j in range(n):
        s = w[..., j:, j:]
        m = n - j
        absakk = s[..., 0, 0].abs()
        zero_index = torch.zeros(batch, dtype=torch.int64, device=a.device)
        if m > 1:
            below = s[..., 1:, 0].abs()
            candidate = below.argmax(-1) + 1  # the first of equals, as idamax
            colmax = below.amax(-1)
            row = _row(s, candidate).abs()
            app = row.gather(-1, candidate.unsqueeze(-1)).squeeze(-1)
            others = row.scatter(-1, candidate.unsqueeze(-1), torch.zeros_like(row[..., :1]))
            rowmax = others.amax(-1)
            safe_rowmax = torch.where(rowmax == 0, torch.ones_like(rowmax), rowmax)
            keep = (absakk >= _ALPHA * colmax) | (
                absakk >= _ALPHA * colmax * (colmax / safe_rowmax)
            )
            zero = torch.maximum(absakk, colmax) == 0
            swap_one = ~zero & ~keep & (app >= _ALPHA * rowmax)
            two = ~zero & ~keep & ~swap_one & ~passing
        else:
            candidate = zero_index
            zero = absakk == 0
            swap_one = two = torch.zeros_like(zero)
        swap_one = swap_one & ~passing
        # LAPACK interchanges the pivot's row and column (the first, or a 2x2 block's second)
        # with the candidate's: one permutation of the trailing matrix, gathered both ways.
        kk = two.to(torch.int64)
        kp = torch.where(swap_one | two, candidate, kk)
        order = torch.arange(m, device=a.device).expand(*batch, m).clone()
        order.scatter_(-1, kk.unsqueeze(-1), kp.unsqueeze(-1))
        order.scatter_(-1, kp.unsqueeze(-1), kk.unsqueeze(-1))
        s_swapped = s.gather(-2, order.unsqueeze(-1).expand(*batch, m, m))
        s_swapped = s_swapped.gather(-1, order.unsqueeze(-2).expand(*batch, m, m))
        updated = _one_by_one(s_swapped)
        if m > 1:
            updated = _pick(two, _two_by_two(s_swapped), updated)
        unchanged = passing | zero
        w[..., j:, j:] = _pick(unchanged, s, updated)

        chosen = j + 1 + torch.where(swap_one | two, candidate, zero_index).to(torch.int32)
        pivots[..., j] = torch.where(passing, pivots[..., j], torch.where(two, -chosen, chosen))
        if m > 1:
            pivots[..., j + 1] = torch.where(two, -chosen, pivots[..., j + 1])
        singular.append(zero & ~passing)
        passing = two
    ld = w.tril()
    return column_major(ld), pivots, first_flagged(torch.stack(singular, dim=-1))


def _one_by_one(s: torch.Tensor) -> torch.Tensor:
    """``s`` after a 1x1 pivot ``s[0, 0]``: its column scaled into L's, the rest updated."""
    out = s.clone()
    if s.shape[-1] == 1:
        return out
    d = s[..., 0, 0]
    inverse = 1 / torch.where(d == 0, torch.ones_like(d), d)
    column = s[..., 1:, 0]
    scaled = column * inverse.unsqueeze(-1)
    out[..., 1:, 1:] = _symmetric(s[..., 1:, 1:] - column.unsqueeze(-1) * scaled.unsqueeze(-2))
    out[..., 1:, 0] = scaled
    return out


def _two_by_two(s: torch.Tensor) -> torch.Tensor:
    """``s`` after a 2x2 pivot block ``s[:2, :2]``, as ``sytf2`` computes it."""
    out = s.clone()
    if s.shape[-1] <= 2:
        return out
    d21 = s[..., 1, 0]
    d21 = torch.where(d21 == 0, torch.ones_like(d21), d21)
    d11 = s[..., 1, 1] / d21
    d22 = s[..., 0, 0] / d21
    t = 1 / (d11 * d22 - 1)
    d21 = (t / d21).unsqueeze(-1)
    first, second = s[..., 2:, 0], s[..., 2:, 1]
    wk = d21 * (d11.unsqueeze(-1) * first - second)
    wkp1 = d21 * (d22.unsqueeze(-1) * second - first)
    trailing = s[..., 2:, 2:] - first.unsqueeze(-1) * wk.unsqueeze(-2)
    trailing = trailing - second.unsqueeze(-1) * wkp1.unsqueeze(-2)
    out[..., 2:, 2:] = _symmetric(trailing)
    out[..., 2:, 0] = wk
    out[..., 2:, 1] = wkp1
    return out


def _symmetric(m: torch.Tensor) -> torch.Tensor:
    """The lower triangle of ``m`` mirrored: what ``sytf2`` stores, both ways."""
    lower = m.tril()
    return lower + lower.tril(-1).mT


def solve(ld: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sytrs``: X with ``A X = B`` from A's factors (batches already broadcast)."""
    n = ld.shape[-1]
    x = b.contiguous().clone()
    two = pivots < 0
    # Which columns open a 2x2 block and which close one: blocks are consecutive pairs.
    opens, closes = [], []
    closing = torch.zeros_like(two[..., 0])
    for j in range(n):
        opening = two[..., j] & ~closing
        opens.append(opening)
        closes.append(closing)
        closing = opening
    interchange = (pivots.abs() - 1).long()
    rows = torch.arange(n, device=ld.device)

    for j in range(n):  # L D y = P b
        one = ~two[..., j]
        swap_rows(x, j, torch.where(one, interchange[..., j], rows[j]))
        if j + 1 < n:
            swap_rows(x, j + 1, torch.where(opens[j], interchange[..., j], rows[j + 1]))
        after_one = x.clone()
        if j + 1 < n:
            after_one[..., j + 1 :, :] -= ld[..., j + 1 :, j : j + 1] * x[..., j : j + 1, :]
        after_one[..., j, :] *= 1 / ld[..., j : j + 1, j]  # sytrs scales by the reciprocal
        chosen = _pick(one, after_one, x)
        if j + 1 < n:
            chosen = _pick(opens[j], _block_forward(ld, x, j), chosen)
        x = chosen

    for j in range(n - 1, -1, -1):  # L^T P^T x = y
        one = ~two[..., j]
        after = x.clone()
        if j + 1 < n:
            tail = x[..., j + 1 :, :]
            after[..., j, :] -= (ld[..., j + 1 :, j].unsqueeze(-2) @ tail).squeeze(-2)
            if j > 0:
                closing_update = (ld[..., j + 1 :, j - 1].unsqueeze(-2) @ tail).squeeze(-2)
                after[..., j - 1, :] = _pick(
                    closes[j], after[..., j - 1, :] - closing_update, after[..., j - 1, :]
                )
        x = _pick(one | closes[j], after, x)
        swap_rows(x, j, torch.where(one | closes[j], interchange[..., j], rows[j]))
    return x


def _block_forward(ld: torch.Tensor, x: torch.Tensor, j: int) -> torch.Tensor:
    """``x`` after ``sytrs``'s forward step for a 2x2 block at columns ``j`` and ``j + 1``."""
    out = x.clone()
    if j + 2 < ld.shape[-1]:
        out[..., j + 2 :, :] -= ld[..., j + 2 :, j : j + 1] * x[..., j : j + 1, :]
        out[..., j + 2 :, :] -= ld[..., j + 2 :, j + 1 : j + 2] * x[..., j + 1 : j + 2, :]
    akm1k = ld[..., j + 1, j]
    akm1k = torch.where(akm1k == 0, torch.ones_like(akm1k), akm1k).unsqueeze(-1)
    akm1 = ld[..., j, j].unsqueeze(-1) / akm1k
    ak = ld[..., j + 1, j + 1].unsqueeze(-1) / akm1k
    denominator = akm1 * ak - 1
    bkm1 = x[..., j, :] / akm1k
    bk = x[..., j + 1, :] / akm1k
    out[..., j, :] = (ak * bkm1 - bk) / denominator
    out[..., j + 1, :] = (akm1 * bk - bkm1) / denominator
    return out


def _finite_square(a: torch.Tensor) -> bool:
    """Fits, is cheaper on the device, and holds no infinity or NaN (the one value read
    back)."""
    return (
        square_floats(a, WIDEST)
        and _FACTOR.on_device((a.shape, a.dtype), lambda: factor_cost(a))
        and bool(torch.isfinite(a).all())
    )


def _ldl_factor_ex(
    a: torch.Tensor, *, hermitian: bool = False, check_errors: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if check_errors or not _finite_square(a):
        return through_the_cpu(
            "aten::linalg_ldl_factor_ex.out",
            torch.ops.aten.linalg_ldl_factor_ex,
            (a,),
            hermitian=hermitian,
            check_errors=check_errors,
        )
    record("fixed", "aten::linalg_ldl_factor_ex.out")
    return factor(a)  # a real matrix's hermitian factors are its symmetric ones


def _ldl_solve(
    ld: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, hermitian: bool = False
) -> torch.Tensor:
    n = ld.shape[-1] if ld.dim() >= 2 else 0
    fits = (
        ld.dim() >= 2
        and b.dim() >= 2
        and ld.shape[-2] == n == b.shape[-2]
        and pivots.shape[-1:] == (n,)
        and b.dtype == ld.dtype
        and pivots.dtype == torch.int32
        and ld.dtype in FLOATS
        and within(n, WIDEST)
        and _SOLVE.on_device(
            (ld.shape, pivots.shape, b.shape, b.dtype), lambda: solve_cost(ld, pivots, b)
        )
    )
    if not fits:
        return through_the_cpu(
            "aten::linalg_ldl_solve.out",
            torch.ops.aten.linalg_ldl_solve,
            (ld, pivots, b),
            hermitian=hermitian,
        )
    record("fixed", "aten::linalg_ldl_solve.out")
    batch = torch.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    k = b.shape[-1]
    x = solve(ld.expand(*batch, n, n), pivots.expand(*batch, n), b.expand(*batch, n, k))
    return column_major(x)


def factor_cost(a: torch.Tensor, *, hermitian: bool = False, check_errors: bool = False) -> Costs:
    """Per column, both pivot choices, the interchange and both updates for every matrix
    (106 kernels; a 1x1 matrix's one column takes the short path), and the finiteness check
    read back once."""
    n, batch = a.shape[-1], call_costs.matrices(a.shape)
    launches = 51 if n == 1 else 106 * n - 81
    flops = batch * n**3 / 3  # sytrf
    results = a.numel() * a.element_size() + batch * (n + 1) * call_costs.INDEX_BYTES
    return Costs(
        call_costs.composition(
            launches,
            1,
            batch=batch,
            itemsize=a.element_size(),
            elements=0.15 * n * n + n,
            flops=flops,
        ),
        call_costs.fallback((a,), results, flops),
    )


def solve_cost(
    ld: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, hermitian: bool = False
) -> Costs:
    """Per column, both the 1x1 and the 2x2 block's step, selected, each way: 64 kernels."""
    n, columns = ld.shape[-1], b.shape[-1]
    batch = max(call_costs.matrices(ld.shape), call_costs.matrices(b.shape))
    launches = 32 if n == 1 else 64 * n - 42
    flops = batch * 2 * n * n * columns  # sytrs
    return Costs(
        call_costs.composition(
            launches,
            0,
            batch=batch,
            itemsize=b.element_size(),
            elements=2 + 0.45 * n * columns + 0.3 * n,
            flops=flops,
        ),
        call_costs.fallback((ld, pivots, b), batch * n * columns * b.element_size(), flops),
    )


def reset() -> None:
    _FACTOR.reset()
    _SOLVE.reset()


COSTS = {"aten::linalg_ldl_factor_ex": factor_cost, "aten::linalg_ldl_solve": solve_cost}

KERNELS = (
    Kernel("linalg_ldl_factor_ex", _ldl_factor_ex, "fallback"),
    Kernel("linalg_ldl_solve", _ldl_solve, "fallback"),
)
