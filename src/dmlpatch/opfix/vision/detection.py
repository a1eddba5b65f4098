"""torchvision's detection operators on the device: ``nms``, ``roi_align``, ``roi_pool``,
``ps_roi_align``, ``ps_roi_pool`` and ``deform_conv2d``.

torchvision ships CPU and CUDA kernels only, so on DirectML every call runs through the CPU
fallback: Faster R-CNN's ``nms`` (8 calls a step) and ``roi_align`` with its backward (6 and 4)
copied 225 MB to the host and back per training step. They are composed here of operators
DirectML has, registered for ``torchvision::`` on ``PrivateUse1`` (before torchvision is
imported, if it is: the dispatcher takes an implementation ahead of the operator's schema).

- ``nms``: greedy suppression as a fixed point (:func:`greedy_nms`); the answer is
  torchvision's index for index. Each round ends with a one-byte read to see whether anything
  changed, where the fallback copies the boxes out and the indices back once.
- ``roi_align``: bilinear interpolation is separable, so the average of a bin's samples is a
  product of two interpolation matrices, one over the rows and one over the columns of the
  feature map: ``out[k, c] = Ay[k] @ x[image of k, c] @ Ax[k].T``. Per image, one matrix
  product for all its regions' rows, then one batched product for their columns, with no
  per-sample gather; autograd differentiates them, so ``_roi_align_backward`` is never needed
  on the device. Host reads: the regions per image, and under adaptive sampling
  (``sampling_ratio <= 0``) the largest grid. The products do more arithmetic than the CPU
  kernel's loops (each row product runs over the whole map's height): cheap on a GPU, slower
  than the fallback on the simulator's CPU kernels (``benchmarks/vision_ops.py``).
- ``roi_pool``: a rectangle's maximum is the maximum of its rows' maxima (and the first in
  row-major order is the first row's reaching it, at that row's first); the backward adds each
  bin's gradient at its maximum.
- ``ps_roi_align`` / ``ps_roi_pool``: every channel pooled over every bin (sample averages, or
  window sums with indicator matrices), each bin then keeping its own channel.
- ``deform_conv2d``: each kernel tap read at its offset by four weighted gathers, the columns
  multiplied by the weight group by group; autograd differentiates it all.

Each call takes the composition or DirectML's fallback, whichever the cost model prices lower
for its shapes (:mod:`~dmlpatch.opfix.vision.detection_costs`): on the shipped adapter profiles
``nms`` of up to a few thousand boxes (a read-back per round) and ``roi_pool`` (its masked
maxima move ``PW`` times the regions' maps) go through the CPU, as do small calls of the
others; a detector's batch of ``roi_align`` and a ``deform_conv2d`` layer stay composed.
``_roi_pool_backward`` is always composed (13 kernels against three read-backs).
"""

from __future__ import annotations

import torch

from dmlpatch.costs.choice import Chooser, CostFunction
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu
from dmlpatch.opfix.vision import detection_costs

_NMS = Chooser("torchvision::nms")
_ROI_ALIGN = Chooser("torchvision::roi_align")
_PS_ROI_ALIGN = Chooser("torchvision::ps_roi_align")
_ROI_POOL = Chooser("torchvision::roi_pool")
_PS_ROI_POOL = Chooser("torchvision::ps_roi_pool")
_PS_ROI_POOL_BACKWARD = Chooser("torchvision::_ps_roi_pool_backward")
_DEFORM_CONV2D = Chooser("torchvision::deform_conv2d")
reset = resetting(
    _NMS, _ROI_ALIGN, _PS_ROI_ALIGN, _ROI_POOL, _PS_ROI_POOL, _PS_ROI_POOL_BACKWARD, _DEFORM_CONV2D
)


def _threshold_below(threshold: float, dtype: torch.dtype) -> float:
    """torchvision compares a float IoU with the threshold as a double; in ``dtype`` the same
    test is ``iou > t`` with ``t`` the largest ``dtype`` value not above the threshold (0.3 is
    not a float32: 126/420 rounds to 0.3f, which exceeds the double 0.3 but not 0.3f)."""
    rounded = torch.tensor(threshold, dtype=torch.float64).to(dtype)
    if rounded.double().item() > threshold:
        rounded = torch.nextafter(rounded, torch.tensor(float("-inf"), dtype=dtype))
    return float(rounded.item())


def greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS as a fixed point, every step a tensor operation on the boxes' device.

    With boxes in score order, box ``i`` is kept iff no kept box ``j < i`` overlaps it by more
    than the threshold. Starting from "keep all", applying that rule to the whole vector
    settles the first ``k`` boxes after ``k`` rounds, and the rule has exactly one fixed point
    (decided box by box in order), so the loop stops on the greedy answer; in practice after a
    handful of rounds (the length of the longest suppression chain), each round ending with one
    one-byte read to see whether anything changed.
    """
    count = boxes.shape[0]
    if count == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    # IoU in float32 for half-precision boxes, as torchvision's CUDA kernel computes it (its
    # accumulate type): a float16 area overflows past 65504 (a 256 x 256 box).
    accumulate = torch.float32 if boxes.dtype in (torch.float16, torch.bfloat16) else boxes.dtype
    ordered = boxes[order].to(accumulate)
    x1, y1, x2, y2 = ordered.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    positions = torch.arange(count, device=boxes.device)
    threshold = _threshold_below(iou_threshold, accumulate)

    def overlaps(start: int, stop: int) -> torch.Tensor:
        """Whether box ``i`` in ``start:stop`` would suppress box ``j`` (a later one)."""
        # IoU as torchvision computes it: inter / (area_i + area_j - inter), compared with '>'.
        width = (
            torch.minimum(x2[start:stop, None], x2[None, :])
            - torch.maximum(x1[start:stop, None], x1[None, :])
        ).clamp(min=0)
        height = (
            torch.minimum(y2[start:stop, None], y2[None, :])
            - torch.maximum(y1[start:stop, None], y1[None, :])
        ).clamp(min=0)
        inter = width * height
        iou = inter / (areas[start:stop, None] + areas[None, :] - inter)
        return (iou > threshold) & (positions[None, :] > positions[start:stop, None])

    step = detection_costs.BLOCK
    blocks = [(start, min(start + step, count)) for start in range(0, count, step)]
    # The overlap matrix is computed once where it fits (count**2 bytes), else per round.
    whole = count <= detection_costs.WHOLE_MATRIX
    kept_matrix = [overlaps(*block) for block in blocks] if whole else None
    keep = torch.ones(count, dtype=torch.bool, device=boxes.device)
    for _ in range(count):
        suppressed = torch.zeros(count, dtype=torch.bool, device=boxes.device)
        for number, (start, stop) in enumerate(blocks):
            over = kept_matrix[number] if kept_matrix is not None else overlaps(start, stop)
            suppressed |= (over & keep[start:stop, None]).any(0)
        settled = ~suppressed
        if bool(torch.equal(settled, keep)):
            break
        keep = settled
    return order[keep]


def nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """``torchvision::nms`` on the device, or through the CPU where that costs less."""
    key = shapes(dets, scores)
    if not _NMS.on_device(key, lambda: detection_costs.nms(dets, scores, iou_threshold)):
        if dets.dtype is torch.float16 or scores.dtype is torch.float16:
            # torchvision's CPU kernel has no float16; its CUDA kernel computes the overlaps of
            # float16 boxes in float32, as the composition does.
            dets, scores = dets.float(), scores.float()
        arguments = (dets, scores, iou_threshold)
        return through_the_cpu("torchvision::nms", torch.ops.torchvision.nms, arguments)
    record("fixed", "torchvision::nms")
    return greedy_nms(dets, scores, float(iou_threshold))


def _interpolation(
    start: torch.Tensor,
    bin_size: torch.Tensor,
    grid: torch.Tensor,
    most: int,
    pooled: int,
    size: int,
) -> torch.Tensor:
    """``[K, pooled, size]``: row ``p`` of region ``k`` sums the bilinear weights of bin ``p``'s
    sample points over the ``size`` positions of one axis, as torchvision's kernel places and
    weighs them (a sample beyond ``[-1, size]`` counts nothing; one below 0 is read at 0; one
    at or past the last position is read there)."""
    device, dtype = start.device, start.dtype
    bins = torch.arange(pooled, device=device, dtype=dtype)
    steps = torch.arange(most, device=device, dtype=dtype) + 0.5
    # [K, pooled, most]: start + p * bin + (i + .5) * bin / grid, for samples i < grid.
    at = (
        start[:, None, None]
        + bins[None, :, None] * bin_size[:, None, None]
        + steps[None, None, :] * bin_size[:, None, None] / grid[:, None, None]
    )
    used = steps[None, None, :] < grid[:, None, None]
    inside = used & (at >= -1.0) & (at <= size)
    at = at.clamp(min=0)
    low = at.floor()
    last = low >= size - 1
    low = torch.where(last, torch.full_like(low, size - 1), low)
    at = torch.where(last, low, at)
    high = torch.where(last, low, low + 1)
    frac = at - low
    positions = torch.arange(size, device=device, dtype=dtype)
    weight_low = torch.where(inside, 1 - frac, torch.zeros_like(frac))
    weight_high = torch.where(inside, frac, torch.zeros_like(frac))
    # Indicator matrices as numbers: DirectML's product of a float and a bool is a bool.
    at_low = (low[..., None] == positions).to(dtype)
    at_high = (high[..., None] == positions).to(dtype)
    matrix = weight_low[..., None] * at_low + weight_high[..., None] * at_high
    return matrix.sum(2)


def roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    """``torchvision::roi_align`` on the device (differentiable: registered for autograd), or
    through the CPU where that costs less."""
    arguments = (input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    key = (*shapes(input, rois), pooled_height, pooled_width, sampling_ratio, aligned)
    if not _ROI_ALIGN.on_device(key, lambda: detection_costs.roi_align(*arguments)):
        return through_the_cpu("torchvision::roi_align", torch.ops.torchvision.roi_align, arguments)
    record("fixed", "torchvision::roi_align")
    offset = 0.5 if aligned else 0.0
    return _sampled_average(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, offset, aligned
    )


def ps_roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchvision::ps_roi_align`` on the device (differentiable: registered for autograd).

    Position-sensitive: output channel ``c`` of bin ``(i, j)`` averages input channel
    ``(c * PH + i) * PW + j``, with roi_align's samples (offset by half a pixel, no minimum
    size, the count of samples unclamped as torchvision's kernel has it). Every channel is
    pooled over every bin, then each bin keeps its own channel: PH * PW times the products
    needed, in exchange for no gather."""
    channels = input.shape[1]
    bins = pooled_height * pooled_width
    if channels % bins:
        raise RuntimeError("input channels must be a multiple of pooling height * pooling width")
    arguments = (input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio)
    key = (*shapes(input, rois), pooled_height, pooled_width, sampling_ratio)
    if not _PS_ROI_ALIGN.on_device(key, lambda: detection_costs.ps_roi_align(*arguments)):
        operator = torch.ops.torchvision.ps_roi_align
        return through_the_cpu("torchvision::ps_roi_align", operator, arguments)
    record("fixed", "torchvision::ps_roi_align")
    every = _sampled_average(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, 0.5, True,
        clamp_count=False,
    )  # fmt: skip
    return _own_bins(every, channels, pooled_height, pooled_width)


def _sampled_average(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    offset: float,
    exact_extent: bool,
    clamp_count: bool = True,
) -> torch.Tensor:
    """``[K, C, PH, PW]``: each bin's average of bilinear samples, as torchvision's roi_align
    kernel takes them (``exact_extent``: a region smaller than a pixel keeps its size, else it
    is widened to one)."""
    _, channels, height, width = input.shape
    regions = rois.shape[0]
    if regions == 0:
        return input.new_zeros((0, channels, pooled_height, pooled_width))
    boxes = rois[:, 1:5] * spatial_scale - offset
    start_w, start_h, end_w, end_h = boxes.unbind(1)
    roi_width, roi_height = end_w - start_w, end_h - start_h
    if not exact_extent:
        roi_width, roi_height = roi_width.clamp(min=1.0), roi_height.clamp(min=1.0)
    bin_h, bin_w = roi_height / pooled_height, roi_width / pooled_width
    if sampling_ratio > 0:
        grid_h = torch.full_like(bin_h, float(sampling_ratio))
        grid_w = torch.full_like(bin_w, float(sampling_ratio))
        most_h = most_w = sampling_ratio
    else:
        grid_h, grid_w = torch.ceil(bin_h), torch.ceil(bin_w)
        most = torch.stack((grid_h.max(), grid_w.max())).tolist()  # one read for both sizes
        most_h, most_w = max(int(most[0]), 1), max(int(most[1]), 1)
    rows = _interpolation(start_h, bin_h, grid_h, most_h, pooled_height, height)
    columns = _interpolation(start_w, bin_w, grid_w, most_w, pooled_width, width)
    count = grid_h * grid_w
    if clamp_count:
        count = count.clamp(min=1)
    pooled = _separable_products(input, rois, rows, columns)
    return (pooled / count[:, None, None, None]).contiguous()


def _separable_products(
    input: torch.Tensor, rois: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor
) -> torch.Tensor:
    """``[K, C, PH, PW]``: ``rows[k] @ input[image of k, c] @ columns[k].T`` for every region
    ``k`` and channel ``c`` (``rows``: ``[K, PH, H]``, ``columns``: ``[K, PW, W]``).

    Regions are grouped by image (torchvision already lists them so; the sort is stable), so
    that each group's row product is one matrix product with its image: no per-region copy of
    the feature map. One host read gives the group sizes."""
    batch, channels, height, width = input.shape
    pooled_height, pooled_width = rows.shape[1], columns.shape[1]
    images = rois[:, 0].long()
    # sort, not argsort: torch 2.4's argsort(stable=True) is an operator DirectML lacks.
    order = torch.sort(images, stable=True).indices
    # Each image's count of regions, by comparison rather than bincount (a fix of its own,
    # whose checks would read back twice more).
    batches = torch.arange(batch, device=images.device)
    sizes = (images[None, :] == batches[:, None]).sum(1).tolist()
    rows, columns = rows[order], columns[order]
    # [N, H, C * W]: an image as the right operand of its regions' row product.
    by_rows = input.permute(0, 2, 1, 3).reshape(batch, height, channels * width)
    chunk = max(1, detection_costs.CHUNK_ELEMENTS // max(pooled_height * channels * width, 1))
    pieces = []
    first_of_image = 0
    for image, size in enumerate(sizes):
        for first in range(first_of_image, first_of_image + size, chunk):
            last = min(first + chunk, first_of_image + size)
            here = last - first
            across = rows[first:last].reshape(here * pooled_height, height) @ by_rows[image]
            across = across.reshape(here, pooled_height * channels, width)
            pooled = torch.bmm(across, columns[first:last].transpose(1, 2))  # [k, PH * C, PW]
            pieces.append(pooled.reshape(here, pooled_height, channels, pooled_width))
        first_of_image += size
    ordered = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    unordered = torch.sort(order, stable=True).indices
    return ordered[unordered].permute(0, 2, 1, 3)


def _round_half_away(value: torch.Tensor) -> torch.Tensor:
    """C's ``round`` (halves away from zero), which torchvision's kernels use; torch.round
    rounds halves to even."""
    return torch.sign(value) * torch.floor(value.abs() + 0.5)


def _pool_windows(
    start: torch.Tensor, extent: torch.Tensor, pooled: int, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[K, pooled]`` first and past-the-end positions of each bin on one axis, as
    torchvision's roi_pool places them (floor and ceil of the bin's edges, clamped)."""
    bins = torch.arange(pooled, device=start.device, dtype=extent.dtype)
    bin_size = extent[:, None] / pooled
    first = torch.floor(bins[None, :] * bin_size) + start[:, None]
    past = torch.ceil((bins[None, :] + 1) * bin_size) + start[:, None]
    return first.clamp(0, size).long(), past.clamp(0, size).long()


def roi_pool(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchvision::roi_pool`` on the device: each bin's maximum and where it is (the first
    in row-major order, as torchvision's loop finds it), 0 and -1 for an empty bin.

    A rectangle's maximum is the maximum over its rows of each row's maximum, so the columns
    are reduced first (one masked maximum per region, bin column and row) and then the rows;
    the first maximum of the rectangle is the first row's reaching it, at that row's first.
    Through the CPU where that costs less (the masked maxima move ``PW`` times the regions'
    maps)."""
    arguments = (input, rois, spatial_scale, pooled_height, pooled_width)
    key = (*shapes(input, rois), pooled_height, pooled_width)
    if not _ROI_POOL.on_device(key, lambda: detection_costs.roi_pool(*arguments)):
        return through_the_cpu("torchvision::roi_pool", torch.ops.torchvision.roi_pool, arguments)
    record("fixed", "torchvision::roi_pool")
    _, channels, height, width = input.shape
    regions = rois.shape[0]
    if regions == 0:
        empty = input.new_zeros((0, channels, pooled_height, pooled_width))
        return empty, empty.long()
    corners = _round_half_away(rois[:, 1:5] * spatial_scale)
    start_w, start_h, end_w, end_h = corners.unbind(1)
    roi_width = (end_w - start_w + 1).clamp(min=1)
    roi_height = (end_h - start_h + 1).clamp(min=1)
    top, bottom = _pool_windows(start_h, roi_height, pooled_height, height)
    left, right = _pool_windows(start_w, roi_width, pooled_width, width)
    rows = torch.arange(height, device=input.device)
    columns = torch.arange(width, device=input.device)
    in_rows = (rows[None, None, :] >= top[..., None]) & (rows[None, None, :] < bottom[..., None])
    in_columns = (columns[None, None, :] >= left[..., None]) & (
        columns[None, None, :] < right[..., None]
    )  # [K, PW, W]
    lowest = torch.tensor(float("-inf"), dtype=input.dtype, device=input.device)
    images = rois[:, 0].long()
    per_region = channels * height * pooled_width * width
    chunk = max(1, detection_costs.CHUNK_ELEMENTS // max(per_region, 1))
    values, places = [], []
    for first in range(0, regions, chunk):
        last = min(first + chunk, regions)
        picked = input[images[first:last]]  # [k, C, H, W]
        # [k, C, H, PW, W] -> each row's maximum within each bin's columns.
        masked = torch.where(in_columns[first:last, None, None], picked[:, :, :, None, :], lowest)
        row_max, row_at = masked.max(-1)  # [k, C, H, PW]: first maximum of each row
        # [k, C, PH, H, PW] -> the maximum over each bin's rows, the first row reaching it.
        by_rows = torch.where(
            in_rows[first:last, None, :, :, None], row_max[:, :, None, :, :], lowest
        )
        best, best_row = by_rows.max(3)  # [k, C, PH, PW]
        best_column = (
            row_at[:, :, None, :, :]
            .expand_as(by_rows)
            .gather(3, best_row[:, :, :, None, :])[:, :, :, 0, :]
        )
        values.append(best)
        places.append(best_row * width + best_column)
    output, argmax = torch.cat(values), torch.cat(places)
    empty = (bottom <= top)[:, None, :, None] | (right <= left)[:, None, None, :]
    output = torch.where(empty, torch.zeros((), dtype=input.dtype, device=input.device), output)
    argmax = torch.where(empty, torch.full((), -1, dtype=torch.long, device=input.device), argmax)
    return output.contiguous(), argmax.int().contiguous()


def roi_pool_backward(
    grad: torch.Tensor,
    rois: torch.Tensor,
    argmax: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    batch_size: int,
    channels: int,
    height: int,
    width: int,
) -> torch.Tensor:
    """``torchvision::_roi_pool_backward``: each bin's gradient added at its maximum's place
    (empty bins give nothing)."""
    record("fixed", "torchvision::_roi_pool_backward")
    grad_input = grad.new_zeros((batch_size, channels, height * width))
    regions = rois.shape[0]
    if regions == 0:
        return grad_input.reshape(batch_size, channels, height, width)
    places = argmax.long().reshape(regions, channels, -1)
    found = places >= 0
    flat = grad.reshape(regions, channels, -1) * found.to(grad.dtype)
    # Regions of one image add into the same map: a flat index over (image, channel, place).
    images = rois[:, 0].long()
    offsets = (
        images[:, None, None] * channels + torch.arange(channels, device=grad.device)[None, :, None]
    ) * (height * width)
    index = (offsets + places.clamp(min=0)).reshape(-1)
    grad_input = grad_input.reshape(-1).scatter_add(0, index, flat.reshape(-1))
    return grad_input.reshape(batch_size, channels, height, width)


def _own_bins(
    every: torch.Tensor, channels: int, pooled_height: int, pooled_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Of ``[K, C, PH, PW]`` pooled over every channel, the position-sensitive output
    ``[K, C / (PH * PW), PH, PW]`` (bin ``(i, j)`` of output channel ``c`` from input channel
    ``(c * PH + i) * PW + j``) and torchvision's channel mapping."""
    regions, channels_out = every.shape[0], channels // (pooled_height * pooled_width)
    split = every.reshape(regions, channels_out, pooled_height, pooled_width, *every.shape[2:])
    # [k, C_out, PH (input's), PW (input's), PH, PW] -> the entries where both bins agree
    # (each diagonal goes last: PH, then PW).
    output = torch.diagonal(torch.diagonal(split, 0, 2, 4), 0, 2, 3).contiguous()
    mapping = torch.arange(channels, device=every.device, dtype=torch.int32)
    mapping = mapping.reshape(1, channels_out, pooled_height, pooled_width)
    return output, mapping.expand(regions, -1, -1, -1).contiguous()


def _windows(
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    height: int,
    width: int,
    last: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ps_roi_pool's bins as indicator matrices ``[K, PH, H]``, ``[K, PW, W]`` and their
    areas ``[K, PH, PW]`` (0: empty), edges clamped to ``[0, size - last]``: torchvision's
    forward clamps to the last position, its backward to the size."""
    corners = _round_half_away(rois[:, 1:5] * spatial_scale)
    start_w, start_h, end_w, end_h = corners.unbind(1)
    sides = []
    for start, end, pooled, size in (
        (start_h, end_h, pooled_height, height),
        (start_w, end_w, pooled_width, width),
    ):
        extent = (end - start).clamp(min=1)
        bins = torch.arange(pooled, device=rois.device, dtype=extent.dtype)
        bin_size = extent[:, None] / pooled
        first = (torch.floor(bins[None, :] * bin_size) + start[:, None]).clamp(0, size - last)
        past = (torch.ceil((bins[None, :] + 1) * bin_size) + start[:, None]).clamp(0, size - last)
        positions = torch.arange(size, device=rois.device, dtype=extent.dtype)
        inside = (positions >= first[..., None]) & (positions < past[..., None])
        sides.append((inside.to(rois.dtype), (past - first).clamp(min=0)))
    (rows, tall), (columns, wide) = sides
    return rows, columns, tall[:, :, None] * wide[:, None, :]


def ps_roi_pool(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchvision::ps_roi_pool`` on the device: each bin's mean over its window of its own
    channel, as the products of :func:`_separable_products` with indicator matrices."""
    _, channels, height, width = input.shape
    if channels % (pooled_height * pooled_width):
        raise RuntimeError("input channels must be a multiple of pooling height * pooling width")
    arguments = (input, rois, spatial_scale, pooled_height, pooled_width)
    key = (*shapes(input, rois), pooled_height, pooled_width)
    if not _PS_ROI_POOL.on_device(key, lambda: detection_costs.ps_roi_pool(*arguments)):
        operator = torch.ops.torchvision.ps_roi_pool
        return through_the_cpu("torchvision::ps_roi_pool", operator, arguments)
    record("fixed", "torchvision::ps_roi_pool")
    if rois.shape[0] == 0:
        every = input.new_zeros((0, channels, pooled_height, pooled_width))
        return _own_bins(every, channels, pooled_height, pooled_width)
    rows, columns, area = _windows(
        rois, spatial_scale, pooled_height, pooled_width, height, width, last=1
    )
    sums, mapping = _own_bins(
        _separable_products(input, rois, rows, columns), channels, pooled_height, pooled_width
    )
    empty = (area <= 0)[:, None]
    mean = sums / torch.where(empty, torch.ones_like(area[:, None]), area[:, None])
    return torch.where(empty, torch.zeros_like(mean), mean), mapping


def ps_roi_pool_backward(
    grad: torch.Tensor,
    rois: torch.Tensor,
    channel_mapping: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    batch_size: int,
    channels: int,
    height: int,
    width: int,
) -> torch.Tensor:
    """``torchvision::_ps_roi_pool_backward``: each bin's gradient spread evenly over its
    window (torchvision's backward windows reach the last row and column, its forward's do
    not: kept as it computes them), summed over the regions of each image."""
    arguments = (
        grad, rois, channel_mapping, spatial_scale, pooled_height, pooled_width,
        batch_size, channels, height, width,
    )  # fmt: skip
    key = (*shapes(grad, rois), *arguments[3:])
    if not _PS_ROI_POOL_BACKWARD.on_device(
        key, lambda: detection_costs.ps_roi_pool_backward(*arguments)
    ):
        operator = torch.ops.torchvision._ps_roi_pool_backward
        return through_the_cpu("torchvision::_ps_roi_pool_backward", operator, arguments)
    record("fixed", "torchvision::_ps_roi_pool_backward")
    grad_input = grad.new_zeros((batch_size, channels, height, width))
    regions = rois.shape[0]
    if regions == 0:
        return grad_input
    rows, columns, area = _windows(
        rois, spatial_scale, pooled_height, pooled_width, height, width, last=0
    )
    empty = area <= 0
    share = grad / torch.where(empty, torch.ones_like(area), area)[:, None]
    share = torch.where(empty[:, None], torch.zeros_like(share), share)  # [K, C_out, PH, PW]
    channels_out = channels // (pooled_height * pooled_width)
    # Per input channel c = (c_out * PH + i) * PW + j: sum over regions k of its image of
    # share[k, c_out, i, j] * rows[k, i]^T columns[k, j], one batched product per image.
    weighted = share[..., None] * rows[:, None, :, None, :]  # [K, C_out, PH, PW, H]
    weighted = weighted.reshape(regions, channels, height)
    # [K, C_out, PH, PW, W]: bin j's column window, for every output channel and row bin.
    spread = columns[:, None, None].expand(regions, channels_out, pooled_height, -1, -1)
    spread = spread.reshape(regions, channels, width)
    images = rois[:, 0].long()
    for image in range(batch_size):
        mine = images == image
        a = weighted[mine].permute(1, 2, 0)  # [C, H, k]
        b = spread[mine].permute(1, 0, 2)  # [C, k, W]
        grad_input[image] += torch.bmm(a, b)
    return grad_input


def deform_conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> torch.Tensor:
    """``torchvision::deform_conv2d`` on the device (differentiable: registered for autograd).

    Each kernel tap reads the input at its offset position by bilinear interpolation, as
    torchvision's kernel does (a sample at or beyond one pixel outside the image is 0, and
    corners outside it count 0): four gathers of the image with their weights give the
    columns of a convolution, optionally scaled by the mask, which the weight multiplies
    group by group. Autograd's derivatives of the gathers and weights are torchvision's
    formulas for the input, offset and mask gradients. Through the CPU where that costs less
    (a small convolution: its 118 kernels against the fallback's copies)."""
    arguments = (
        input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
        dilation_h, dilation_w, groups, offset_groups, use_mask,
    )  # fmt: skip
    key = (*shapes(input, weight, offset), *arguments[5:])
    if not _DEFORM_CONV2D.on_device(key, lambda: detection_costs.deform_conv2d(*arguments)):
        operator = torch.ops.torchvision.deform_conv2d
        return through_the_cpu("torchvision::deform_conv2d", operator, arguments)
    record("fixed", "torchvision::deform_conv2d")
    batch, channels, height, width = input.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_h = (height + 2 * pad_h - (dilation_h * (kernel_h - 1) + 1)) // stride_h + 1
    out_w = (width + 2 * pad_w - (dilation_w * (kernel_w - 1) + 1)) // stride_w + 1
    taps, places = kernel_h * kernel_w, out_h * out_w
    device, dtype = input.device, input.dtype
    shifts = offset.reshape(batch, offset_groups, taps, 2, out_h, out_w)
    tap_y = (torch.arange(kernel_h, device=device) * dilation_h).repeat_interleave(kernel_w)
    tap_x = (torch.arange(kernel_w, device=device) * dilation_w).repeat(kernel_h)
    row = torch.arange(out_h, device=device) * stride_h - pad_h
    column = torch.arange(out_w, device=device) * stride_w - pad_w
    # [N, G, taps, out_h, out_w]: where each tap reads.
    y = (tap_y[:, None, None] + row[None, :, None]).to(dtype) + shifts[:, :, :, 0]
    x = (tap_x[:, None, None] + column[None, None, :]).to(dtype) + shifts[:, :, :, 1]
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    low_y, low_x = torch.floor(y), torch.floor(x)
    frac_y, frac_x = y - low_y, x - low_x
    per_group = channels // offset_groups
    image = input.reshape(batch, offset_groups, per_group, height * width)
    columns = None
    for step_y, weight_y in ((0, 1 - frac_y), (1, frac_y)):
        for step_x, weight_x in ((0, 1 - frac_x), (1, frac_x)):
            at_y, at_x = low_y + step_y, low_x + step_x
            counts = inside & (at_y >= 0) & (at_y < height) & (at_x >= 0) & (at_x < width)
            index = (at_y.clamp(0, height - 1) * width + at_x.clamp(0, width - 1)).long()
            index = index.reshape(batch, offset_groups, 1, taps * places)
            read = image.gather(3, index.expand(-1, -1, per_group, -1))
            share = (weight_y * weight_x * counts.to(dtype)).reshape(
                batch, offset_groups, 1, taps * places
            )
            term = read * share
            columns = term if columns is None else columns + term
    assert columns is not None
    if use_mask:
        columns = columns * mask.reshape(batch, offset_groups, 1, taps * places)
    # [N, groups, C / groups * taps, places]: rows c * taps + tap, as im2col orders them.
    columns = columns.reshape(batch, groups, (channels // groups) * taps, places)
    kernels = weight.reshape(groups, out_channels // groups, (channels // groups) * taps)
    output = torch.matmul(kernels[None], columns).reshape(batch, out_channels, out_h, out_w)
    return output + bias[None, :, None, None]


#: The operators whose composition can cost more than the fallback, by shape. Not here:
#: ``_roi_pool_backward``, 13 kernels and no read-back against the fallback's three (its
#: gradient, regions and maxima copied down, the whole input's gradient copied up).
COSTS: dict[str, CostFunction] = {
    "torchvision::nms": detection_costs.nms,
    "torchvision::roi_align": detection_costs.roi_align,
    "torchvision::ps_roi_align": detection_costs.ps_roi_align,
    "torchvision::roi_pool": detection_costs.roi_pool,
    "torchvision::ps_roi_pool": detection_costs.ps_roi_pool,
    "torchvision::_ps_roi_pool_backward": detection_costs.ps_roi_pool_backward,
    "torchvision::deform_conv2d": detection_costs.deform_conv2d,
}

KERNELS = (
    Kernel("nms", nms, "fallback", namespace="torchvision"),
    Kernel("roi_align", roi_align, "fallback", key="AutogradPrivateUse1", namespace="torchvision"),
    Kernel(
        "ps_roi_align", ps_roi_align, "fallback", key="AutogradPrivateUse1", namespace="torchvision"
    ),
    Kernel(
        "deform_conv2d",
        deform_conv2d,
        "fallback",
        key="AutogradPrivateUse1",
        namespace="torchvision",
    ),
    Kernel("roi_pool", roi_pool, "fallback", namespace="torchvision"),
    Kernel("ps_roi_pool", ps_roi_pool, "fallback", namespace="torchvision"),
    Kernel("_ps_roi_pool_backward", ps_roi_pool_backward, "fallback", namespace="torchvision"),
    Kernel("_roi_pool_backward", roi_pool_backward, "fallback", namespace="torchvision"),
)
