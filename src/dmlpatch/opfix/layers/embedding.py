"""``nn.EmbeddingBag`` (``_embedding_bag``), which torch-directml 0.2.5 runs on the CPU
(microsoft/DirectML#724), composed on the device for its sum and mean modes.

Recommendation and text-classification models pool embeddings this way on every step. The
composition looks rows up with ``embedding`` (native, and so is its backward), weights them
(``per_sample_weights``), drops ``padding_idx`` rows, and adds each row into its bag with a
scatter-add whose index comes from the offsets; mean divides by the bag's non-padding size, an
empty bag is zeros, as on the CPU. It is registered at ``AutogradPrivateUse1``: autograd
differentiates the composition (``embedding_dense_backward``, ``gather``: both native). Max
mode, ``scale_grad_by_freq`` and sparse gradients go through the CPU, counted as fallbacks.

The composition is 15 to 22 kernels and no read-back, where the fallback reads back the whole
table, the indices and the offsets; but it moves every looked-up row several times (about 21
bytes per index and column), so many indices into a small table are cheaper through the CPU
(a million indices into a 1000-row table: 40 ms composed on an integrated GPU, 6 ms through
the CPU): the cost model chooses per call (:func:`cost`).
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import fallback, nbytes, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu

_SUM, _MEAN = 0, 1

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def cost(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Optional[torch.Tensor] = None,
    include_last_offset: bool = False,
    padding_idx: Optional[int] = -1,
) -> Costs:
    """The bag of each index (4 kernels), the rows looked up, kept and added into their bags
    (8), the sizes (3), the mean's division (3), the per-sample weights (1), the end of the last
    bag (3). The fallback: the table, the indices and the offsets down, the bags and their
    bookkeeping up, an add per looked-up element on the host."""
    count, bags = indices.numel(), offsets.numel() - (1 if include_last_offset else 0)
    width = weight.shape[1]
    weighted = per_sample_weights is not None
    launches = 15 + (3 if mode == _MEAN else 0) + int(weighted) + (3 if include_last_offset else 0)
    moved = count * width * (21 + (8 if weighted else 0)) + 40 * count + 12 * bags * width
    moved += nbytes(weight)  # the lookup's kernel reads from the whole table
    device = OnDevice(launches, 0, moved, float(count * width * 3))
    up = bags * width * weight.element_size() + 8 * (count + 2 * bags)
    host = float(count * width * (3 if weighted else 2))
    return Costs(
        device, fallback(weight, indices, offsets, per_sample_weights, up=up, host_flops=host)
    )


_EMBEDDING_BAG = Chooser("aten::_embedding_bag")
_FORWARD_ONLY = Chooser("aten::_embedding_bag_forward_only")
reset = resetting(_EMBEDDING_BAG, _FORWARD_ONLY)
COSTS: dict[str, CostFunction] = {
    "aten::_embedding_bag": cost,
    "aten::_embedding_bag_forward_only": cost,
}


def _bag_of_each_index(offsets: torch.Tensor, bags: int, count: int) -> torch.Tensor:
    """For each position of ``indices``, the bag it belongs to (bags may be empty)."""
    starts = offsets[1:bags].long().clamp(max=count)
    marks = torch.zeros(count + 1, dtype=torch.long, device=offsets.device)
    marks.scatter_add_(0, starts, torch.ones_like(starts))
    return torch.cumsum(marks[:count], 0)


def _embedding_bag(
    name: str,
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Optional[torch.Tensor] = None,
    include_last_offset: bool = False,
    padding_idx: Optional[int] = -1,
) -> Result:
    padding = -1 if padding_idx is None else padding_idx
    arguments = (weight, indices, offsets, scale_grad_by_freq, mode, sparse)
    tail = (per_sample_weights, include_last_offset, padding_idx)
    chooser = _EMBEDDING_BAG if name == "_embedding_bag" else _FORWARD_ONLY
    key = (*shapes(weight, indices, offsets, per_sample_weights), mode, include_last_offset)
    if (
        mode not in (_SUM, _MEAN)
        or scale_grad_by_freq
        or sparse
        or not chooser.on_device(key, lambda: cost(*arguments, *tail))
    ):
        return through_the_cpu(f"aten::{name}", getattr(torch.ops.aten, name), (*arguments, *tail))
    record("fixed", f"aten::{name}")
    count = indices.numel()
    bags = offsets.numel() - (1 if include_last_offset else 0)
    width = weight.shape[1]
    bag_of = _bag_of_each_index(offsets, bags, count)
    rows = torch.nn.functional.embedding(indices, weight)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    keep = indices != padding if padding >= 0 else torch.ones_like(indices, dtype=torch.bool)
    if include_last_offset:
        # The last offset ends the last bag: indices after it belong to none.
        positions = torch.arange(count, device=indices.device)
        keep = keep & (positions < offsets[bags])
    rows = rows * keep.unsqueeze(1).to(rows.dtype)
    zeros = torch.zeros(bags, width, dtype=weight.dtype, device=weight.device)
    output = zeros.scatter_add(0, bag_of.unsqueeze(1).expand(count, width), rows)
    sizes = torch.zeros(bags, dtype=torch.long, device=weight.device)
    sizes = sizes.scatter_add(0, bag_of, keep.long())
    if mode == _MEAN:
        output = output / sizes.clamp(min=1).unsqueeze(1).to(output.dtype)
    no_max = torch.zeros(bags, dtype=torch.long, device=weight.device)
    return output, bag_of, sizes, no_max


def _training(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Optional[torch.Tensor] = None,
    include_last_offset: bool = False,
    padding_idx: Optional[int] = -1,
) -> Result:
    return _embedding_bag(
        "_embedding_bag",
        weight,
        indices,
        offsets,
        scale_grad_by_freq,
        mode,
        sparse,
        per_sample_weights,
        include_last_offset,
        padding_idx,
    )


def _forward_only(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Optional[torch.Tensor] = None,
    include_last_offset: bool = False,
    padding_idx: Optional[int] = -1,
) -> Result:
    return _embedding_bag(
        "_embedding_bag_forward_only",
        weight,
        indices,
        offsets,
        scale_grad_by_freq,
        mode,
        sparse,
        per_sample_weights,
        include_last_offset,
        padding_idx,
    )


KERNELS = (
    Kernel("_embedding_bag", _training, "fallback", "AutogradPrivateUse1"),
    Kernel("_embedding_bag_forward_only", _forward_only, "fallback", "AutogradPrivateUse1"),
)
