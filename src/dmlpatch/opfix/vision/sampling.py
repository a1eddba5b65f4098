"""``grid_sampler_2d`` (``F.grid_sample``), which torch-directml 0.2.5 runs on the CPU forward
and backward, composed on the device.

RT-DETR's deformable attention samples every feature level with it on every step, and spatial
transformers and optical-flow warps are built on it. Bilinear and nearest sampling with zeros
or border padding (what those models use) are composed of gathers, registered at
``AutogradPrivateUse1`` so that autograd differentiates the composition (the input's gradient
is a scatter-add, the grid's flows through the interpolation weights); the CPU kernel's
arithmetic is followed: ``unnormalize`` as ``GridSampler.h``, the four corner weights as its
``nw``/``ne``/``sw``/``se``, nearest as round-half-to-even. Bicubic sampling and reflection
padding go through the CPU, as DirectML's fallback would, and are counted as fallbacks; so do
the calls the cost model finds cheaper there (:func:`cost`: the composition is 27 to 56
kernels whatever the size, against the fallback's two read-backs and its copies, so a small
sample of a small image is cheaper through the CPU).
"""

from __future__ import annotations

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import fallback, resetting, shapes

_BILINEAR, _NEAREST = 0, 1
_ZEROS, _BORDER = 0, 1


def _unnormalize(coordinate: torch.Tensor, size: int, align_corners: bool) -> torch.Tensor:
    if align_corners:
        return (coordinate + 1) / 2 * (size - 1)
    return ((coordinate + 1) * size - 1) / 2


def _source_index(
    coordinate: torch.Tensor, size: int, padding_mode: int, align_corners: bool
) -> torch.Tensor:
    index = _unnormalize(coordinate, size, align_corners)
    if padding_mode == _BORDER:
        # The CPU kernel clips NaN to the first row or column, as it clips -inf.
        index = torch.where(index != index, 0.0, index).clamp(0, size - 1)
    return index


def _gather(
    flat: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    weights: torch.Tensor,
    width: int,
    height: int,
) -> torch.Tensor:
    """``sum_k weights[k] * input[n, :, y[k], x[k]]`` over the ``K`` corners of each point:
    ``x``, ``y`` and ``weights`` are ``(N, K, P)`` (integer-valued coordinates), a corner
    outside the image reads 0. One gather for all corners (each corner's points contiguous),
    the weights multiplied in before they meet the channels, the corners added in the CPU
    kernel's order; ``unbind`` keeps the backward to one gradient buffer, not one per corner."""
    inside = (x >= 0) & (x <= width - 1) & (y >= 0) & (y <= height - 1)
    # NaN and infinite coordinates are outside (every comparison with NaN is False); they are
    # read at 0 and masked, as the CPU kernel masks them.
    x, y = torch.where(inside, x, 0), torch.where(inside, y, 0)
    n, corners, points = x.shape
    index = (y * width + x).long().reshape(n, 1, corners * points)
    channels = flat.shape[1]
    values = flat.gather(2, index.expand(-1, channels, -1)).reshape(n, channels, corners, points)
    first, *others = (values * (weights * inside.to(weights.dtype)).unsqueeze(1)).unbind(2)
    for corner in others:
        first = first + corner
    return first


def _on_device(
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> torch.Tensor:
    n, c, height, width = input.shape
    out_h, out_w = grid.shape[1], grid.shape[2]
    ix = _source_index(grid[..., 0].reshape(n, -1), width, padding_mode, align_corners)
    iy = _source_index(grid[..., 1].reshape(n, -1), height, padding_mode, align_corners)
    flat = input.reshape(n, c, height * width)
    if interpolation_mode == _NEAREST:
        x, y = torch.round(ix).unsqueeze(1), torch.round(iy).unsqueeze(1)
        weights = torch.ones_like(x)
        if grid.requires_grad and torch.is_grad_enabled():
            # Weights of one that keep the grid in the graph: its gradient is the CPU's zeros,
            # not None (autograd.grad would refuse it, and an optimizer would skip it).
            weights = weights + (torch.where(x.isfinite() & y.isfinite(), x + y, 0)) * 0
        out = _gather(flat, x, y, weights, width, height)
        return out.reshape(n, c, out_h, out_w)
    ix_nw, iy_nw = torch.floor(ix), torch.floor(iy)
    ix_se, iy_se = ix_nw + 1, iy_nw + 1
    # The corners nw, ne, sw, se, and their weights as GridSampler.h computes them.
    x = torch.stack((ix_nw, ix_se, ix_nw, ix_se), 1).detach()
    y = torch.stack((iy_nw, iy_nw, iy_se, iy_se), 1).detach()
    weights = torch.stack(
        (
            (ix_se - ix) * (iy_se - iy),
            (ix - ix_nw) * (iy_se - iy),
            (ix_se - ix) * (iy - iy_nw),
            (ix - ix_nw) * (iy - iy_nw),
        ),
        1,
    )
    return _gather(flat, x, y, weights, width, height).reshape(n, c, out_h, out_w)


def cost(
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> Costs:
    """The composition: 46 kernels bilinear (27 nearest), 2 more to unnormalise without
    ``align_corners``, 8 more to clip to the border; its bytes are the gather of every corner's
    channels and the arithmetic on each point's coordinates. The fallback: the input and the
    grid copied down, the output up, the CPU's interpolation per channel and point."""
    batch, channels = input.shape[0], input.shape[1]
    points = batch * grid.shape[1] * grid.shape[2]
    bilinear = interpolation_mode == _BILINEAR
    launches = (46 if bilinear else 27) + (0 if align_corners else 2)
    launches += 8 if padding_mode == _BORDER else 0
    size = input.element_size()
    per_point = (27 * channels + 170) if bilinear else (5 * channels + 45)
    device = OnDevice(launches, 0, size * points * per_point, float(points * per_point / 4))
    output = points * channels * size
    host = points * (channels * (8 if bilinear else 1) + 20)
    return Costs(device, fallback(input, grid, up=output, host_flops=host))


_GRID_SAMPLER_2D = Chooser("aten::grid_sampler_2d")
reset = resetting(_GRID_SAMPLER_2D)
COSTS: dict[str, CostFunction] = {"aten::grid_sampler_2d": cost}


def _grid_sampler_2d(
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> torch.Tensor:
    arguments = (input, grid, interpolation_mode, padding_mode, align_corners)
    if interpolation_mode in (_BILINEAR, _NEAREST) and padding_mode in (_ZEROS, _BORDER):
        key = (*shapes(input, grid), interpolation_mode, padding_mode, align_corners)
        if _GRID_SAMPLER_2D.on_device(key, lambda: cost(*arguments)):
            record("fixed", "aten::grid_sampler_2d")
            return _on_device(*arguments)
    # Bicubic, reflection, and what costs less there: through the CPU, differentiably, as
    # DirectML's fallback does.
    copies = 3
    nbytes = (input.numel() + grid.numel()) * input.element_size()
    record("fallback", "aten::grid_sampler_2d", copies, nbytes)
    host = (input.cpu(), grid.cpu())
    try:
        out = torch.grid_sampler_2d(*host, interpolation_mode, padding_mode, align_corners)
    except RuntimeError as error:
        # torch 2.4's CPU has no float16 grid sampler (2.14's has): float32 there, rounded
        # once, as float16 fallbacks go (precision.half_on_host).
        if input.dtype is not torch.float16 or "not implemented for" not in str(error):
            raise
        wide = (host[0].float(), host[1].float())
        out = torch.grid_sampler_2d(*wide, interpolation_mode, padding_mode, align_corners)
        out = out.half()
    return out.to(input.device)


KERNELS = (Kernel("grid_sampler_2d", _grid_sampler_2d, "fallback", "AutogradPrivateUse1"),)
