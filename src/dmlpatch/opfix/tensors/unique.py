"""``unique`` and its relatives on the device: sort, adjacent difference, cumulative sum.

DirectML refuses ``_unique2`` (``torch.unique`` without ``dim``) with ``return_counts`` or
``return_inverse`` (ultralytics' detection loss calls ``batch_idx.unique(return_counts=True)``
every step) and has no kernel at all for ``unique_dim``, ``unique_consecutive``,
``unique_dim_consecutive`` and ``_unique``, which therefore run on the CPU.

The results equal the CPU's exactly, including its contracts: values come out sorted whatever
``sorted`` says (the CPU always sorts) and each NaN is its own value. Of values that compare
equal (``-0.0`` and ``0.0``) the first in stable sorted order is kept; the CPU's choice there
depends on its unstable sort, and PyTorch does not specify it (nor which NaN's group number each
NaN gets in the inverse). Operators used, all native on DirectML: ``sort.stable``, ``ne``,
``any``, ``cat``, ``masked_select``, ``index_select``, ``cumsum``, ``nonzero``, ``scatter``,
``sub``, ``full``, ``arange``, views and copies.

Each composition reads back once (the count of unique values), twice with counts, and launches
4 to 10 kernels flat, ``3 * m`` more for rows of ``m`` elements (a stable sort per column):
against the fallback's one read-back and two copies, small inputs and long rows are cheaper
through the CPU. The cost model chooses per call for the operators DirectML has no kernel for
(:func:`cost`); ``_unique2`` with counts or an inverse is refused, so it is always composed.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu

Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _no_index(like: torch.Tensor) -> torch.Tensor:
    """What the CPU returns for an inverse or counts output nobody asked for."""
    return torch.empty(0, dtype=torch.long, device=like.device)


def _group_starts(differs: torch.Tensor) -> torch.Tensor:
    """A boolean mask of group starts from ``differs[i]`` = element ``i+1`` differs from ``i``.

    Built with ``cat`` rather than by writing ``mask[0] = True``: single-element writes are
    reported to be silently lost on DirectML.
    """
    first = torch.ones(1, dtype=torch.bool, device=differs.device)
    return torch.cat([first, differs]) if differs.numel() else first


def _counts(starts: torch.Tensor, total: int) -> torch.Tensor:
    """Group sizes from the group-start mask: differences of consecutive start positions."""
    positions = starts.nonzero().reshape(-1)
    end = torch.full((1,), total, dtype=torch.long, device=starts.device)
    return torch.cat([positions[1:], end]) - positions


def _inverse(starts: torch.Tensor, order: Optional[torch.Tensor]) -> torch.Tensor:
    """Each element's group number, in the original order (``order``: the sort permutation)."""
    group = torch.cumsum(starts, 0, dtype=torch.long) - 1
    if order is None:
        return group
    return torch.empty_like(group).scatter_(0, order, group)


def unique_flat(
    self: torch.Tensor, consecutive: bool, return_inverse: bool, return_counts: bool
) -> Triple:
    """Unique values of the flattened tensor (``_unique2``; ``unique_consecutive`` without dim)."""
    flat = self.reshape(-1)
    total = flat.numel()
    if total == 0:
        inverse = _no_index(self)
        return flat.clone(), inverse.reshape(self.shape) if return_inverse else inverse, inverse
    if consecutive:
        keys, order = flat, None
    else:
        keys, order = torch.sort(flat, stable=True)
    starts = _group_starts(keys[1:] != keys[:-1])
    values = torch.masked_select(keys, starts)
    inverse = _inverse(starts, order).reshape(self.shape) if return_inverse else _no_index(self)
    counts = _counts(starts, total) if return_counts else _no_index(self)
    return values, inverse, counts


def _lexicographic_order(rows: torch.Tensor) -> torch.Tensor:
    """The permutation sorting ``rows`` (n x m) lexicographically: stable sorts by each column,
    last column first (least-significant-digit radix order)."""
    order = torch.arange(rows.shape[0], device=rows.device)
    for column in range(rows.shape[1] - 1, -1, -1):
        keys = rows.select(1, column).index_select(0, order)
        order = order.index_select(0, torch.sort(keys, stable=True).indices)
    return order


def _check_empty_dims(self: torch.Tensor, dim: int) -> None:
    """The CPU's own errors, in its order, for unique along ``dim`` with zero-sized dims."""
    zero_dims = sum(1 for size in self.shape if size == 0)
    if self.shape[dim] == 0:
        if zero_dims > 1:
            raise RuntimeError(
                "Number of zero sized dimensions is more than one, so unique cannot be applied "
            )
    elif zero_dims:
        raise RuntimeError(
            "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied"
        )


def unique_rows(
    self: torch.Tensor, dim: int, consecutive: bool, return_inverse: bool, return_counts: bool
) -> Triple:
    """Unique slices along ``dim`` (``unique_dim``, ``unique_dim_consecutive``)."""
    dim = dim + self.dim() if dim < 0 else dim
    if not 0 <= dim < max(self.dim(), 1):
        self.size(dim)  # raises PyTorch's own IndexError for the bad dimension
    _check_empty_dims(self, dim)
    if self.numel() == 0:
        return self.clone(), _no_index(self), _no_index(self)
    moved = self.movedim(dim, 0)
    total = moved.shape[0]
    rows = moved.reshape(total, -1)
    if consecutive:
        order, ordered = None, rows
    else:
        order = _lexicographic_order(rows)
        ordered = rows.index_select(0, order)
    starts = _group_starts((ordered[1:] != ordered[:-1]).any(dim=1))
    kept = ordered.index_select(0, starts.nonzero().reshape(-1))
    values = kept.reshape((kept.shape[0], *moved.shape[1:])).movedim(0, dim)
    inverse = _inverse(starts, order) if return_inverse else _no_index(self)
    counts = _counts(starts, total) if return_counts else _no_index(self)
    return values.contiguous(), inverse, counts


# ---- what they cost ----


def cost(
    self: torch.Tensor,
    dim: Optional[int],
    consecutive: bool,
    return_inverse: bool,
    return_counts: bool,
) -> Costs:
    """:func:`unique_flat` (``dim`` None) or :func:`unique_rows`, as counted from their code:
    the group starts (4 kernels flat: ``ne``, a ``cat`` of a one, ``masked_select``; rows: also
    ``any`` and an ``index_select`` of the kept rows, and the two copies of moving ``dim``
    first and back), a stable sort first unless ``consecutive`` (flat: 1; rows: 2 and 3 per
    column), the inverse (2, 3 when sorted: scattered back to the input's order), the counts
    (4, and a read-back). The fallback copies the input down and, taking every value as
    unique (an upper bound), the values, the inverse and the counts up."""
    size = self.element_size()
    total = self.numel()
    if dim is None:
        rows, width, moved = total, 1, 0
        launches = 4 + (0 if consecutive else 1)
    else:
        dim = dim % max(self.dim(), 1)
        rows = self.shape[dim] if self.dim() else 1
        width = total // max(rows, 1)
        moved = 2 if dim and math.prod(self.shape[:dim]) > 1 else 0
        launches = 6 + moved + (0 if consecutive else 2 + 3 * width)
    launches += (2 if consecutive else 3) if return_inverse else 0
    launches += 4 if return_counts else 0
    sorts = 0 if consecutive else width
    moved_bytes = total * (4 * size + 2) + sorts * rows * (3 * size + 48) + rows * 60
    moved_bytes += 2 * total * 2 * size if moved else 0  # dim moved first and back
    logarithm = math.log2(max(rows, 2))
    device = OnDevice(launches, 1 + (1 if return_counts else 0), moved_bytes, float(total * 8))
    up = total * size + 8 * rows * (int(return_inverse) + int(return_counts))
    host = 2.0 * rows * logarithm * width + total
    return Costs(device, fallback(self, up=up, host_flops=host))


def _unique_cost(self: torch.Tensor, sorted: bool = True, return_inverse: bool = False) -> Costs:
    return cost(self, None, False, return_inverse, False)


def _unique_dim_cost(
    self: torch.Tensor,
    dim: int,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> Costs:
    return cost(self, dim, False, return_inverse, return_counts)


def _unique_consecutive_cost(
    self: torch.Tensor,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: Optional[int] = None,
) -> Costs:
    return cost(self, dim, True, return_inverse, return_counts)


def _unique_dim_consecutive_cost(
    self: torch.Tensor, dim: int, return_inverse: bool = False, return_counts: bool = False
) -> Costs:
    return cost(self, dim, True, return_inverse, return_counts)


COSTS: dict[str, CostFunction] = {
    "aten::_unique": _unique_cost,
    "aten::unique_dim": _unique_dim_cost,
    "aten::unique_consecutive": _unique_consecutive_cost,
    "aten::unique_dim_consecutive": _unique_dim_consecutive_cost,
}
_UNIQUE = Chooser("aten::_unique")
_UNIQUE_DIM = Chooser("aten::unique_dim")
_UNIQUE_CONSECUTIVE = Chooser("aten::unique_consecutive")
_UNIQUE_DIM_CONSECUTIVE = Chooser("aten::unique_dim_consecutive")
_CHOOSERS = {
    chooser.operator: chooser
    for chooser in (_UNIQUE, _UNIQUE_DIM, _UNIQUE_CONSECUTIVE, _UNIQUE_DIM_CONSECUTIVE)
}
reset = resetting(*_CHOOSERS.values())


def _composed(operator: str, *arguments: Any) -> bool:
    """Whether this call takes the composition (the cost model's choice, by its shape and
    the outputs asked for)."""
    key = (*shapes(arguments[0]), *arguments[1:])
    return _CHOOSERS[operator].on_device(key, lambda: COSTS[operator](*arguments))


# ---- the registered kernels ----


def _unique2(
    self: torch.Tensor,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> Triple:
    if not (return_inverse or return_counts):
        # DirectML's own kernel handles this case: let it.
        outputs = [self.new_empty(0), _no_index(self), _no_index(self)]
        torch.ops.aten._unique2.out(
            self, sorted, False, False, out0=outputs[0], out1=outputs[1], out2=outputs[2]
        )
        return outputs[0], outputs[1], outputs[2]
    record("fixed", "aten::_unique2")
    return unique_flat(self, False, return_inverse, return_counts)


def _unique(
    self: torch.Tensor, sorted: bool = True, return_inverse: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    if not _composed("aten::_unique", self, sorted, return_inverse):
        arguments = (self, sorted, return_inverse)
        return through_the_cpu("aten::_unique", torch.ops.aten._unique, arguments)
    record("fixed", "aten::_unique")
    values, inverse, _ = unique_flat(self, False, return_inverse, False)
    return values, inverse


def _unique_dim(
    self: torch.Tensor,
    dim: int,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
) -> Triple:
    arguments = (self, dim, sorted, return_inverse, return_counts)
    if not _composed("aten::unique_dim", *arguments):
        return through_the_cpu("aten::unique_dim", torch.ops.aten.unique_dim, arguments)
    record("fixed", "aten::unique_dim")
    return unique_rows(self, dim, False, return_inverse, return_counts)


def _unique_consecutive(
    self: torch.Tensor,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: Optional[int] = None,
) -> Triple:
    arguments = (self, return_inverse, return_counts, dim)
    if not _composed("aten::unique_consecutive", *arguments):
        operator = torch.ops.aten.unique_consecutive
        return through_the_cpu("aten::unique_consecutive", operator, arguments)
    record("fixed", "aten::unique_consecutive")
    if dim is None:
        return unique_flat(self, True, return_inverse, return_counts)
    return unique_rows(self, dim, True, return_inverse, return_counts)


def _unique_dim_consecutive(
    self: torch.Tensor, dim: int, return_inverse: bool = False, return_counts: bool = False
) -> Triple:
    arguments = (self, dim, return_inverse, return_counts)
    if not _composed("aten::unique_dim_consecutive", *arguments):
        operator = torch.ops.aten.unique_dim_consecutive
        return through_the_cpu("aten::unique_dim_consecutive", operator, arguments)
    record("fixed", "aten::unique_dim_consecutive")
    return unique_rows(self, dim, True, return_inverse, return_counts)


KERNELS = (
    Kernel("_unique2", _unique2, "refused"),
    Kernel("_unique", _unique, "fallback"),
    Kernel("unique_dim", _unique_dim, "fallback"),
    Kernel("unique_consecutive", _unique_consecutive, "fallback"),
    Kernel("unique_dim_consecutive", _unique_dim_consecutive, "fallback"),
)
