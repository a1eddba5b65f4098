"""Antialiased resizing (``_upsample_bilinear2d_aa``, ``_upsample_bicubic2d_aa``) and exact
nearest resizing (``_upsample_nearest_exact1d/2d/3d``), which torch-directml 0.2.5 runs on the
CPU forward and backward, composed on the device.

They are what torchvision's transforms call on a device tensor: ``transforms.v2.Resize``
antialiases by default, and ``InterpolationMode.NEAREST_EXACT`` is the exact nearest. Through
DirectML's fallback every call copies the whole batch down, resizes it on the CPU and copies
the result up, a read-back that drains the queue (27 MB each way per call in torchvision's own
transform tests).

Both resizes are separable: an output row mixes a few input rows with weights that depend only
on the sizes, the scale, ``align_corners`` and the mode. The weights and source indices are
computed on the host once per such key (no read-back: host arithmetic, then one upload) and
kept; each call then runs, per resized dimension, one ``index_select`` for exact nearest, and
``index_select``, a multiply and a sum over the taps for the antialiased modes (the banded form:
an output row reads ``K`` rows, ``K = 2 * ceil(support) + 1``, not every input row as a dense
weight matrix would). The backward is the transpose: a multiply and a ``scatter_add`` per
dimension.

Cost per call on DirectML, against the fallback it replaces (``n`` input elements, ``m``
output elements, ``d`` resized dimensions): nearest exact, ``d`` launches and no read-back
against two copies of ``n + m`` elements and a queue drain; antialiased, ``3 * 2`` launches and
about ``K * m`` elements moved per pass, no read-back. The first call of a new size adds one
upload of ``K`` indices and weights per output row. A launch costs less than the
fallback's synchronising read-back alone, so the composition wins from the smallest image up,
and exact nearest (one gather per dimension) at every size. The antialiased passes, though,
move ``K`` times the output through memory three times over: where memory is little faster
than the bus (an integrated GPU) a large batch is cheaper through the CPU (a batch of 16
512x512 images to 224x224 on Iris Xe: 29 ms composed against 17 ms through the CPU), so the
cost model chooses per call for the antialiased modes (:data:`COSTS`).

Weights follow the CPU kernel (``UpSampleKernel.cpp``): the filter's support is
``interp_size / 2`` times the scale when downsampling, the window of each output position
starts at ``int(center - support + 0.5)``, weights are the filter (triangle, or Keys' cubic with
``a = -0.5``) at ``(j + xmin - center + 0.5) / scale`` normalised to sum 1. Computed in float64
and rounded to the input's dtype, they can differ from the CPU's float32 weights in the last
bit. float16 is computed in float32 and rounded back, as CUDA does. Other dtypes (uint8 images
given straight to ``F.interpolate``, float64) go through the CPU as DirectML's fallback does,
counted as fallbacks.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional

import torch
from torch._prims_common import suggest_memory_format

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into
from dmlpatch.opfix.cost_terms import fallback, resetting, shapes
from dmlpatch.opfix.cpu_ops import cpu_kernel

#: The dtypes composed on the device; others take the CPU path.
_COMPOSED = (torch.float32, torch.float16)

#: The number of input positions the filter spans at scale 1 (``interp_size``).
_INTERP_SIZE = {"bilinear": 2, "bicubic": 4}


def _triangle(x: torch.Tensor) -> torch.Tensor:
    x = x.abs()
    return torch.where(x < 1.0, 1.0 - x, 0.0)


def _keys_cubic(x: torch.Tensor) -> torch.Tensor:
    a = -0.5  # Keys' cubic as PIL and the CPU's antialiased kernel take it
    x = x.abs()
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, 0.0))


_FILTERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "bilinear": _triangle,
    "bicubic": _keys_cubic,
}


def _area_scale(
    input_size: int, output_size: int, align_corners: bool, scale: Optional[float]
) -> float:
    """The CPU's ``area_pixel_compute_scale``: input positions per output position."""
    if align_corners:
        return (input_size - 1) / (output_size - 1) if output_size > 1 else 0.0
    if scale is not None and scale > 0:
        return 1.0 / scale
    return input_size / output_size


@functools.lru_cache(maxsize=256)
def _band(
    mode: str, input_size: int, output_size: int, align_corners: bool, scale: Optional[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The source indices ``[output_size, K]`` and float64 weights of each output position
    along one dimension; taps past the window have weight 0 and a valid index."""
    ratio = _area_scale(input_size, output_size, align_corners, scale)
    interp = _INTERP_SIZE[mode]
    support = interp * 0.5 * ratio if ratio >= 1.0 else interp * 0.5
    taps = math.ceil(support) * 2 + 1
    inverse = 1.0 / ratio if ratio >= 1.0 else 1.0
    centers = ratio * (torch.arange(output_size, dtype=torch.float64) + 0.5)
    # The CPU kernel's int64 casts truncate; both ends are clipped to the input.
    starts = (centers - support + 0.5).trunc().clamp(min=0)
    ends = (centers + support + 0.5).trunc().clamp(max=input_size)
    widths = (ends - starts).clamp(0, taps)
    offsets = torch.arange(taps, dtype=torch.float64)
    weights = _FILTERS[mode]((offsets + starts[:, None] - centers[:, None] + 0.5) * inverse)
    weights = torch.where(offsets < widths[:, None], weights, 0.0)
    totals = weights.sum(1, keepdim=True)
    weights = torch.where(totals != 0.0, weights / totals, weights)
    indices = (starts[:, None] + offsets).clamp(max=input_size - 1).long()
    return indices, weights


@functools.lru_cache(maxsize=256)
def _exact_nearest(input_size: int, output_size: int, scale: Optional[float]) -> torch.Tensor:
    """The CPU's ``nearest_exact_idx`` of every output position: the float32 scale, the
    position's centre in double rounded to float, floored."""
    factor = 1.0 / scale if scale is not None and scale > 0 else input_size / output_size
    as_float32 = torch.tensor(factor, dtype=torch.float32).double()
    centres = (torch.arange(output_size, dtype=torch.float64) + 0.5) * as_float32
    return torch.floor(centres.float()).long().clamp(max=input_size - 1)


@functools.lru_cache(maxsize=256)
def _on(device: torch.device, dtype: Optional[torch.dtype], host: torch.Tensor) -> torch.Tensor:
    """``host`` uploaded once per device (and dtype, for weights)."""
    return host.to(device, dtype) if dtype is not None else host.to(device)


def _resized(
    x: torch.Tensor, dim: int, indices: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``x`` along ``dim`` replaced by the weighted taps of each output position."""
    out_size, taps = indices.shape
    gathered = x.index_select(dim, _on(x.device, None, indices).reshape(-1))
    shape = list(x.shape)
    shape[dim : dim + 1] = [out_size, taps]
    gathered = gathered.reshape(shape)
    view = [1] * gathered.dim()
    view[dim], view[dim + 1] = out_size, taps
    return (gathered * _on(x.device, x.dtype, weights).reshape(view)).sum(dim + 1)


def _spread(
    grad: torch.Tensor,
    dim: int,
    input_size: int,
    indices: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The transpose of :func:`_resized`: each output position's gradient scattered back to
    its taps, weighted (``weights=None``: one tap of weight 1, exact nearest)."""
    out_size, taps = indices.shape
    shape = list(grad.shape)
    shape[dim] = out_size * taps
    if weights is None:
        weighted = grad
    else:
        view = [1] * (grad.dim() + 1)
        view[dim], view[dim + 1] = out_size, taps
        weighted = grad.unsqueeze(dim + 1) * _on(grad.device, grad.dtype, weights).reshape(view)
        weighted = weighted.reshape(shape)
    index_view = [1] * grad.dim()
    index_view[dim] = out_size * taps
    index = _on(grad.device, None, indices).reshape(index_view).expand(shape)
    target = list(grad.shape)
    target[dim] = input_size
    return grad.new_zeros(target).scatter_add_(dim, index, weighted)


def _in_float32(x: torch.Tensor, compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    if x.dtype is torch.float16:
        return compute(x.float()).half()
    return compute(x)


#: A composition's core: the result, or None where the arguments take the CPU path.
Core = Callable[..., Optional[torch.Tensor]]


def _taps(mode: str, input_size: int, output_size: int, align_corners: bool, scale: Any) -> int:
    """``K``: the input positions an output position reads along one dimension."""
    ratio = _area_scale(input_size, output_size, align_corners, scale)
    interp = _INTERP_SIZE[mode]
    support = interp * 0.5 * ratio if ratio >= 1.0 else interp * 0.5
    return math.ceil(support) * 2 + 1


def aa_cost(mode: str, backward: bool) -> Callable[..., Costs]:
    """The cost function of an antialiased resize (``backward``: of its gradient): per
    dimension a gather, a weighting and a sum of the ``K`` taps (3 kernels, the widest over
    ``K`` times the output), or for the gradient a weighting, a zero input and a
    ``scatter_add`` (3); a cast each way for float16. The fallback: the input (gradient) down,
    the result up, a multiply-add per tap on the host."""

    def cost(
        self: torch.Tensor,
        output_size: list[int],
        *rest: Any,
    ) -> Costs:
        if backward:
            input_size, align_corners, *scales = rest
        else:
            input_size, (align_corners, *scales) = list(self.shape), rest
        scale_h = scales[0] if scales else None
        scale_w = scales[1] if len(scales) > 1 else None
        lead = math.prod(input_size[:-2])
        (height, width), (out_h, out_w) = input_size[-2:], output_size
        taps_w = _taps(mode, width, out_w, align_corners, scale_w)
        taps_h = _taps(mode, height, out_h, align_corners, scale_h)
        # The width first ([.., H, W] -> [.., H, out_w]), then the height: K taps gathered each.
        wide = lead * height * out_w
        gathered = lead * out_w * (height * taps_w + out_h * taps_h)
        size = self.element_size()
        half = self.dtype is torch.float16
        image, result = lead * height * width, lead * out_h * out_w
        moved = 4 * (image + 4 * gathered + 2 * wide + result)
        moved += 8 * (image + result) if half else 0
        device = OnDevice(6 + (2 if half else 0), 0, moved, 2.0 * gathered)
        up = (image if backward else result) * size
        return Costs(device, fallback(self, up=up, host_flops=2.0 * gathered))

    return cost


COSTS: dict[str, CostFunction] = {
    f"aten::_upsample_{mode}2d_aa{suffix}": aa_cost(mode, bool(suffix))
    for mode in _INTERP_SIZE
    for suffix in ("", "_backward")
}
_BILINEAR = Chooser("aten::_upsample_bilinear2d_aa")
_BILINEAR_BACKWARD = Chooser("aten::_upsample_bilinear2d_aa_backward")
_BICUBIC = Chooser("aten::_upsample_bicubic2d_aa")
_BICUBIC_BACKWARD = Chooser("aten::_upsample_bicubic2d_aa_backward")
_CHOOSERS = {
    chooser.operator: chooser
    for chooser in (_BILINEAR, _BILINEAR_BACKWARD, _BICUBIC, _BICUBIC_BACKWARD)
}
reset = resetting(*_CHOOSERS.values())


def _composed(operator: str, tensor: torch.Tensor, *arguments: Any) -> bool:
    """Whether the cost model sends this antialiased resize to the composition."""
    key = (*shapes(tensor), *(tuple(a) if isinstance(a, list) else a for a in arguments))
    return _CHOOSERS[operator].on_device(key, lambda: COSTS[operator](tensor, *arguments))


def _aa_forward(mode: str, name: str) -> Core:
    def forward(
        self: torch.Tensor,
        output_size: list[int],
        align_corners: bool,
        scales_h: Optional[float] = None,
        scales_w: Optional[float] = None,
    ) -> Optional[torch.Tensor]:
        if self.dtype not in _COMPOSED:
            return None
        arguments = (output_size, align_corners, scales_h, scales_w)
        if not _composed(f"aten::_upsample_{mode}2d_aa", self, *arguments):
            return None
        record("fixed", name)
        height, width = self.shape[-2:]

        def compute(x: torch.Tensor) -> torch.Tensor:
            # The last dimension first, as the CPU kernel does.
            band_w = _band(mode, width, output_size[1], align_corners, scales_w)
            band_h = _band(mode, height, output_size[0], align_corners, scales_h)
            return _resized(_resized(x, x.dim() - 1, *band_w), x.dim() - 2, *band_h)

        return _in_float32(self, compute)

    return forward


def _aa_backward(mode: str, name: str) -> Core:
    def backward(
        grad_output: torch.Tensor,
        output_size: list[int],
        input_size: list[int],
        align_corners: bool,
        scales_h: Optional[float] = None,
        scales_w: Optional[float] = None,
    ) -> Optional[torch.Tensor]:
        if grad_output.dtype not in _COMPOSED:
            return None
        arguments = (output_size, input_size, align_corners, scales_h, scales_w)
        if not _composed(f"aten::_upsample_{mode}2d_aa_backward", grad_output, *arguments):
            return None
        record("fixed", name)
        height, width = input_size[-2:]

        def compute(g: torch.Tensor) -> torch.Tensor:
            band_h = _band(mode, height, output_size[0], align_corners, scales_h)
            band_w = _band(mode, width, output_size[1], align_corners, scales_w)
            g = _spread(g, g.dim() - 2, height, *band_h)
            return _spread(g, g.dim() - 1, width, *band_w)

        return _in_float32(grad_output, compute)

    return backward


def _exact_forward(rank: int, name: str) -> Core:
    def forward(self: torch.Tensor, output_size: list[int], *scales: Any) -> torch.Tensor:
        record("fixed", name)
        result = self
        for k in range(rank):
            dim = self.dim() - rank + k
            scale = scales[k] if k < len(scales) else None
            indices = _exact_nearest(self.shape[dim], output_size[k], scale)
            result = result.index_select(dim, _on(self.device, None, indices))
        return result

    return forward


def _exact_backward(rank: int, name: str) -> Core:
    def backward(
        grad_output: torch.Tensor, output_size: list[int], input_size: list[int], *scales: Any
    ) -> torch.Tensor:
        record("fixed", name)
        gradient = grad_output
        for k in range(rank):
            dim = grad_output.dim() - rank + k
            scale = scales[k] if k < len(scales) else None
            indices = _exact_nearest(input_size[dim], output_size[k], scale)
            gradient = _spread(gradient, dim, input_size[dim], indices.unsqueeze(1))
        return gradient

    return backward


def _served(
    operator: str, out_overload: str, make: Callable[[str], Core], *, laid_out: bool = False
) -> tuple[Kernel, Kernel]:
    """The functional and ``out=`` kernels of ``operator``, both computed by ``make``'s core
    (counted under the ``out=`` overload's name, as DirectML names the operator); arguments the
    core declines go through the CPU, as DirectML's fallback would take them. ``laid_out``: the
    result takes the memory format the input suggests, as every forward CPU kernel here lays it
    out (the backward kernels disagree among themselves, and autograd restrides a gradient)."""
    packet = getattr(torch.ops.aten, operator)
    name = f"aten::{operator}.{out_overload}"
    core = make(name)
    on_the_cpu = cpu_kernel(packet.default, upcast_half=True, reported=name)
    out_on_the_cpu = cpu_kernel(getattr(packet, out_overload), upcast_half=True)

    def functional(*args: Any) -> torch.Tensor:
        result = core(*args)
        if result is None:
            return on_the_cpu(*args)
        if not laid_out:
            return result
        # A channels-last batch stays channels-last (torchvision checks it); a contiguous one
        # costs nothing.
        return result.contiguous(memory_format=suggest_memory_format(args[0]))

    def out_form(*args: Any, **out: torch.Tensor) -> torch.Tensor:
        result = core(*args)
        if result is None:
            return out_on_the_cpu(*args, **out)
        (target,) = out.values()
        return into(target, result)

    return (
        Kernel(operator, functional, "fallback"),
        Kernel(f"{operator}.{out_overload}", out_form, "fallback"),
    )


def _kernels() -> tuple[Kernel, ...]:
    found: list[Kernel] = []
    for mode in _INTERP_SIZE:
        found += _served(
            f"_upsample_{mode}2d_aa", "out", functools.partial(_aa_forward, mode), laid_out=True
        )
        found += _served(
            f"_upsample_{mode}2d_aa_backward",
            "grad_input",
            functools.partial(_aa_backward, mode),
        )
    for rank in (1, 2, 3):
        found += _served(
            f"_upsample_nearest_exact{rank}d",
            "out",
            functools.partial(_exact_forward, rank),
            laid_out=True,
        )
        found += _served(
            f"_upsample_nearest_exact{rank}d_backward",
            "grad_input",
            functools.partial(_exact_backward, rank),
        )
    return tuple(found)


KERNELS = _kernels()
