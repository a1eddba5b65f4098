"""``native_group_norm_backward``, which torch-directml 0.2.5 runs on the CPU, on the device.

GroupNorm is in every diffusion UNet and VAE block, so each training step copies every group
norm's input and gradient to the host and back (microsoft/DirectML#678). The forward is native.
This backward is the CPU kernel's arithmetic (``GroupNormKernel.cpp``) in tensor operations:
per-channel sums ``ds = sum(dy * x)`` and ``db = sum(dy)``, folded into per-group coefficients
(``g`` is the weight, sums over the channels of a group, ``n = D * HxW``)::

    dx = rstd * g * dy + c2 * x + c3
    c2 = (sum(db * g) * mean - sum(ds * g)) * rstd**3 / n
    c3 = -c2 * mean - sum(db * g) * rstd / n
    dg = sum over the batch of (ds - db * mean) * rstd;  dbias = sum over the batch of db

33 kernels and no read-back, against the fallback's five read-backs and its copies of the
activation and its gradient; the kernels pass over the activation about five times (56 bytes
an element), so where memory is little faster than the bus (an integrated GPU) a large one is
about as cheap through the CPU: the cost model chooses per call (:func:`cost`).
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import elementwise, fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def _per_channel(per_group: torch.Tensor, channels_per_group: int) -> torch.Tensor:
    """``(N, G)`` → ``(N, C, 1)``: each group's value for each of its channels."""
    n, groups = per_group.shape
    return (
        per_group.unsqueeze(2)
        .expand(n, groups, channels_per_group)
        .reshape(n, groups * channels_per_group, 1)
    )


def cost(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    N: int,
    C: int,
    HxW: int,
    group: int,
    output_mask: list[bool],
) -> Costs:
    """The per-channel sums (3 kernels, 20 bytes an element), the input's gradient (23, a
    ones weight first where there is none; 36 bytes an element more), the weight's (6) and the
    bias's (1) where there is a weight. The fallback: the five tensors down, the gradients up,
    about 8 operations an element."""
    n, size = input.numel(), input.element_size()
    scaled = weight is not None
    launches = 3 + (23 + (0 if scaled else 1) if output_mask[0] else 0)
    launches += (6 if output_mask[1] and scaled else 0) + (1 if output_mask[2] and scaled else 0)
    device = elementwise(launches, n, 20 + (36 if output_mask[0] else 0), size)
    up = n * size * output_mask[0] + 2 * C * size
    return Costs(device, fallback(grad_out, input, mean, rstd, weight, up=up, host_flops=8.0 * n))


_GROUP_NORM_BACKWARD = Chooser("aten::native_group_norm_backward")
reset = resetting(_GROUP_NORM_BACKWARD)
COSTS: dict[str, CostFunction] = {"aten::native_group_norm_backward": cost}


def _group_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    N: int,
    C: int,
    HxW: int,
    group: int,
    output_mask: list[bool],
) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    arguments = (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)
    key = (*shapes(grad_out, input, weight), group, tuple(output_mask))
    if not _GROUP_NORM_BACKWARD.on_device(key, lambda: cost(*arguments)):
        operator = torch.ops.aten.native_group_norm_backward
        return through_the_cpu("aten::native_group_norm_backward", operator, arguments)
    record("fixed", "aten::native_group_norm_backward")
    per_group = C // group
    x = input.reshape(N, C, HxW)
    dy = grad_out.reshape(N, C, HxW)
    mean = mean.reshape(N, group)
    rstd = rstd.reshape(N, group)
    ds = (dy * x).sum(2)
    db = dy.sum(2)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gamma = (
            weight.reshape(1, C)
            if weight is not None
            else torch.ones(1, C, dtype=x.dtype, device=x.device)
        )
        ds_group = (ds * gamma).reshape(N, group, per_group).sum(2)
        db_group = (db * gamma).reshape(N, group, per_group).sum(2)
        scale = 1.0 / (per_group * HxW)
        c2 = (db_group * mean - ds_group) * rstd * rstd * rstd * scale
        c3 = -c2 * mean - db_group * rstd * scale
        c1 = _per_channel(rstd, per_group) * gamma.reshape(1, C, 1)
        dx = c1 * dy + _per_channel(c2, per_group) * x + _per_channel(c3, per_group)
        grad_input = dx.reshape(input.shape)
    if output_mask[1] and weight is not None:
        mean_c = _per_channel(mean, per_group).squeeze(2)
        rstd_c = _per_channel(rstd, per_group).squeeze(2)
        grad_weight = ((ds - db * mean_c) * rstd_c).sum(0)
    if output_mask[2] and weight is not None:
        grad_bias = db.sum(0)
    return grad_input, grad_weight, grad_bias


KERNELS = (Kernel("native_group_norm_backward", _group_norm_backward, "fallback"),)
