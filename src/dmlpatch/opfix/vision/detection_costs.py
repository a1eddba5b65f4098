"""What :mod:`dmlpatch.opfix.vision.detection`'s compositions cost on DirectML, and what
DirectML's CPU fallback of the same call costs: the cost functions of its ``COSTS``.

Launches and read-backs are counted from the compositions' code (a fixed part, plus a part per
suppression round, image or chunk); bytes are the large tensors each kernel reads and writes,
FLOPs the matrix products' multiply-adds and one per element of the widest tensor elsewhere.
The fallback copies its tensor arguments down (a read-back each) and its results up, and its
CPU kernel's arithmetic is estimated from torchvision's loops.

What the shapes do not say is estimated, and said here:

- ``nms``: the rounds to the fixed point (the longest chain of suppression, plus one) are taken
  as ``ceil(log2(n) / 2)`` (2 and 5 were measured on 100 and 1000 random boxes); the CPU
  kernel compares every pair of boxes it keeps with the rest, taken as half of all pairs;
- ``roi_align`` with adaptive sampling (``sampling_ratio <= 0``): 2 samples a side, the fixed
  ratio detection models pass; regions are taken as spread evenly over the images;
- ``roi_pool`` / ``ps_roi_pool``: a region's window is taken as a quarter of the map.

The backward passes of the differentiable operators are not counted: autograd's derivative of
a composition and the fallback's backward kernel scale alike.
"""

from __future__ import annotations

import math

import torch

from dmlpatch.costs.choice import Costs, OnDevice
from dmlpatch.opfix.cost_terms import fallback, nbytes

#: The compositions' limits, which their costs depend on: rows of the IoU matrix computed at
#: once (memory for ``BLOCK * n`` values), boxes whose overlap matrix (a byte a pair) is kept
#: across rounds, elements of roi_align's and roi_pool's per-chunk intermediates.
BLOCK = 2048
WHOLE_MATRIX = 8192
CHUNK_ELEMENTS = 1 << 24
#: Samples a side taken for adaptive sampling, and a region's share of its feature map.
ADAPTIVE_GRID = 2
REGION_SHARE = 0.25


def nms_rounds(count: int) -> int:
    """The estimated rounds to the fixed point for ``count`` boxes."""
    return max(2, math.ceil(math.log2(max(count, 2)) / 2))


def nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float, rounds: int = 0) -> Costs:
    """``greedy_nms``: sort and gather (2), areas (3), positions (1); the overlap test (15
    kernels per block of rows: the IoU, the threshold, the order), once where the matrix is
    kept, else every round; a round clears the suppressed mask (1), adds each block's (3), and
    compares with the last (2: not, equal, a read-back); the kept indices (1, a read-back)."""
    count = dets.shape[0]
    rounds = rounds or nms_rounds(count)
    blocks = max(1, math.ceil(count / BLOCK))
    kept = count <= WHOLE_MATRIX
    widened = 1 if dets.dtype in (torch.float16, torch.bfloat16) else 0
    overlap = 15 * blocks
    launches = 6 + widened + 1 + 1 + (overlap if kept else 0)
    launches += rounds * (3 + 3 * blocks + (0 if kept else overlap))
    pairs = count * count
    # The overlap test moves about 10 bytes per pair per kernel; a round reads the bool matrix
    # with the kept mask (and, any: about 3 bytes a pair).
    tests = 1 if kept else rounds
    device = OnDevice(
        launches=launches,
        readbacks=rounds + 1,
        bytes=150.0 * pairs * tests + 3.0 * pairs * rounds + 64.0 * count,
        flops=15.0 * pairs * tests + 3.0 * pairs * rounds,
    )
    return Costs(device, fallback(dets, scores, up=8.0 * count, host_flops=7.5 * pairs))


def _pieces(input: torch.Tensor, rois: torch.Tensor, pooled_height: int) -> int:
    """The (image, chunk) products of ``_separable_products``, regions spread evenly."""
    batch, channels, _, width = input.shape
    regions = rois.shape[0]
    images = min(batch, regions)
    chunk = max(1, CHUNK_ELEMENTS // max(pooled_height * channels * width, 1))
    per_image = math.ceil(regions / max(images, 1))
    return max(1, images * math.ceil(per_image / chunk))


def _separable(
    input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int, most: int
) -> tuple[float, float, int]:
    """Bytes, FLOPs and pieces of the interpolation matrices and ``_separable_products``."""
    _, channels, height, width = input.shape
    regions = rois.shape[0]
    size = input.element_size()
    pieces = _pieces(input, rois, pooled_height)
    # About a dozen kernels over [K, pooled, samples, positions] per axis, 4 bytes in, 4 out.
    matrices = regions * (pooled_height * most * height + pooled_width * most * width)
    across = regions * pooled_height * channels * width
    output = regions * channels * pooled_height * pooled_width
    moved = (
        96.0 * matrices
        + 2.0 * nbytes(input)  # the image laid out by rows
        + size * (pieces * channels * height * width + 2 * across + 8 * output)
    )
    flops = 2.0 * regions * pooled_height * height * channels * width + 2.0 * across * pooled_width
    return moved, flops + 12.0 * matrices, pieces


def roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> Costs:
    """``_sampled_average``: 94 kernels (the boxes, both interpolation matrices, the grouping
    by image and the average), 2 more to widen small regions (not ``aligned``), 3 more and a
    read-back to size an adaptive grid; 2 products per image and chunk, and a ``cat`` of
    them; one read-back of the regions per image."""
    adaptive = sampling_ratio <= 0
    most = ADAPTIVE_GRID if adaptive else sampling_ratio
    moved, flops, pieces = _separable(input, rois, pooled_height, pooled_width, most)
    launches = 94 + (0 if aligned else 2) + (3 if adaptive else 0) + 2 * pieces
    launches += 1 if pieces > 1 else 0
    device = OnDevice(launches, 1 + (1 if adaptive else 0), moved, flops)
    samples = rois.shape[0] * input.shape[1] * pooled_height * pooled_width * most * most
    output = rois.shape[0] * input.shape[1] * pooled_height * pooled_width
    return Costs(
        device,
        fallback(input, rois, up=output * input.element_size(), host_flops=8.0 * samples),
    )


def ps_roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
) -> Costs:
    """``roi_align``'s products over every channel and bin (aligned), then each bin's own
    channel (2 kernels: the diagonal and the channel mapping)."""
    adaptive = sampling_ratio <= 0
    most = ADAPTIVE_GRID if adaptive else sampling_ratio
    moved, flops, pieces = _separable(input, rois, pooled_height, pooled_width, most)
    launches = 96 + (3 if adaptive else 0) + 2 * pieces + (1 if pieces > 1 else 0)
    device = OnDevice(launches, 1 + (1 if adaptive else 0), moved, flops)
    output = rois.shape[0] * input.shape[1]  # C_out * PH * PW
    return Costs(
        device,
        fallback(
            input,
            rois,
            up=2 * output * input.element_size(),  # the output and the channel mapping
            host_flops=8.0 * output * most * most,
        ),
    )


def roi_pool(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
) -> Costs:
    """57 kernels (the windows, their masks, the empty bins) and 8 per chunk of regions: the
    regions' maps gathered, each row's maximum within each bin's columns, then over each bin's
    rows, and where it is."""
    _, channels, height, width = input.shape
    regions = rois.shape[0]
    per_region = channels * height * pooled_width * width
    chunks = max(1, math.ceil(regions / max(1, CHUNK_ELEMENTS // max(per_region, 1))))
    size = input.element_size()
    masked = regions * per_region  # [K, C, H, PW, W]
    by_rows = regions * channels * pooled_height * height * pooled_width
    picked = regions * channels * height * width
    device = OnDevice(
        launches=57 + 8 * chunks,
        bytes=2 * size * (masked + by_rows) + 2 * size * picked,
        flops=float(masked + by_rows),
    )
    output = regions * channels * pooled_height * pooled_width
    window = REGION_SHARE * channels * height * width * regions
    return Costs(device, fallback(input, rois, up=output * (size + 4), host_flops=2.0 * window))


def ps_roi_pool(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
) -> Costs:
    """66 kernels (the windows as indicator matrices, the mean, the empty bins) and
    ``_separable_products``' 2 per image and chunk; one read-back of the regions per image."""
    moved, flops, pieces = _separable(input, rois, pooled_height, pooled_width, 1)
    launches = 66 + 2 * pieces + (1 if pieces > 1 else 0)
    device = OnDevice(launches, 1, moved, flops)
    output = rois.shape[0] * input.shape[1]
    window = REGION_SHARE * input.shape[1] * input.shape[2] * input.shape[3] * rois.shape[0]
    window /= pooled_height * pooled_width  # each bin reads its own channel
    return Costs(
        device,
        fallback(input, rois, up=2 * output * input.element_size(), host_flops=window),
    )


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
) -> Costs:
    """57 kernels (the windows, each bin's share) and 6 per image: its regions picked by a mask
    (two read-backs) and their windows multiplied out and added."""
    regions = rois.shape[0]
    size = grad.element_size()
    spread = regions * channels * (height + width)
    image = batch_size * channels * height * width
    device = OnDevice(
        launches=57 + 6 * batch_size,
        readbacks=2 * batch_size,
        bytes=size * (4 * spread + 3 * image),
        flops=2.0 * regions * channels * height * width,
    )
    window = REGION_SHARE * image * regions / max(batch_size, 1) / (pooled_height * pooled_width)
    return Costs(
        device,
        fallback(grad, rois, channel_mapping, up=image * size, host_flops=window),
    )


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
) -> Costs:
    """118 kernels, whatever the shapes: where each tap reads, four weighted gathers of the
    image, the mask, the product with the weight and the bias."""
    batch, channels, height, width = input.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_h = (height + 2 * pad_h - (dilation_h * (kernel_h - 1) + 1)) // stride_h + 1
    out_w = (width + 2 * pad_w - (dilation_w * (kernel_w - 1) + 1)) // stride_w + 1
    taps = kernel_h * kernel_w
    columns = batch * channels * taps * out_h * out_w
    places = batch * offset_groups * taps * out_h * out_w
    size = input.element_size()
    products = 2.0 * batch * out_channels * (channels // groups) * taps * out_h * out_w
    device = OnDevice(
        launches=118,
        bytes=31 * size * columns + 60.0 * size * places + nbytes(weight, input),
        flops=products + 4.0 * 3 * columns,
    )
    output = batch * out_channels * out_h * out_w
    return Costs(
        device,
        fallback(
            input,
            weight,
            offset,
            mask,  # a tensor of zeros where unused, copied all the same
            bias,
            up=output * size,
            host_flops=products + 10.0 * columns,
        ),
    )
