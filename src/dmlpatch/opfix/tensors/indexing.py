"""``repeat_interleave`` with a tensor of repeats, ``count_nonzero`` along dimensions,
``upsample_nearest1d`` (forward and backward) and ``unfold_backward``, which torch-directml
0.2.5 runs on the CPU, composed on the device.

========================== ===============================================================
repeat_interleave.Tensor   each position ``i`` written ``repeats[i]`` times: a scatter-add of
                           ones at the running totals, then a running sum (#449)
count_nonzero.dim_IntList  ``(x != 0).sum(dim)`` (#665)
upsample_nearest1d         ``index_select`` of ``min(floor(j * scale), n - 1)``, ``scale`` in
                           float32 as the CPU kernel computes it (#718); the backward is the
                           scatter-add of the gradient to those indices
roll                       two slices of each rolled dimension, concatenated (``fftshift``)
index_add                  ``scatter_add`` with the index spread along the added rows (the
                           backward of every overlapping ``as_strided``: ``torch.stft``'s)
unfold_backward            the overlap-add of windows (``torch.istft``'s, and the backward of
                           ``Tensor.unfold``: ``torch.stft`` in training): a sum of shifted
                           slices when the hop divides the window, else ``scatter_add``
========================== ===============================================================

Each is a few kernels and no read-back against the fallback's read-back per tensor argument,
except two the cost model chooses for per call: ``repeat_interleave`` reads back twice (the
check for negative repeats and the output's length) where the fallback reads once, so a
short one is cheaper through the CPU (:func:`repeat_interleave_cost`); ``unfold_backward``
adds one slice per window block, so a window many hops long (a step of 1 over a window of 64:
129 kernels) can be (:func:`unfold_backward_cost`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, functional, in_place, into
from dmlpatch.opfix.cost_terms import fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def repeat_interleave_cost(repeats: torch.Tensor, *, output_size: Optional[int] = None) -> Costs:
    """The check for negative repeats (2 kernels, a read-back), the running totals (1), the
    output's length (a read-back, unless given), the marks scattered and summed (5), and the
    casts of int32 repeats (2). The fallback: the repeats down, the output up (its length
    taken as ``output_size``, else as one per repeat)."""
    count = repeats.numel()
    total = output_size if output_size is not None else count
    size = repeats.element_size()
    casts = 0 if repeats.dtype == torch.int64 else 2
    device = OnDevice(
        launches=8 + casts,
        readbacks=2 if output_size is None else 1,
        bytes=66.0 * count + 40.0 * total,
        flops=float(4 * count + 2 * total),
    )
    return Costs(device, fallback(repeats, up=total * size, host_flops=float(total)))


def _moves(input_sizes: list[int], dim: int) -> bool:
    """Whether moving ``dim`` next to the window's positions makes the gradient
    non-contiguous (a copy when it is reshaped)."""
    dim = dim % len(input_sizes)
    return dim != len(input_sizes) - 1 and math.prod(input_sizes[dim + 1 :]) > 1


def unfold_backward_cost(
    grad_in: torch.Tensor, input_sizes: list[int], dim: int, size: int, step: int
) -> Costs:
    """Where the hop divides the window: a zero output (1), and per block of ``step`` values
    of the window an add and its write back (2), plus a copy of the block's slice when the
    hop is longer than 1. Otherwise: the window's indices (4 kernels), the zero output, a
    copy of the gradient where ``dim`` moves, and one ``scatter_add``. The fallback: the
    gradient down, the input's gradient up, an add per element."""
    itemsize = grad_in.element_size()
    elements = grad_in.numel()
    length = math.prod(input_sizes) if input_sizes else 1
    moved = bool(input_sizes) and _moves(input_sizes, dim)
    if size % step == 0:
        blocks = size // step
        launches = 1 + blocks * (2 + (1 if step > 1 else 0))
        moved_bytes = 7 * itemsize * elements + itemsize * length
    else:
        launches = 6 + (1 if moved else 0)
        moved_bytes = (2 * itemsize + 8) * elements + 2 * itemsize * length
    device = OnDevice(launches, 0, moved_bytes, float(elements))
    return Costs(device, fallback(grad_in, up=length * itemsize, host_flops=float(elements)))


_REPEAT_INTERLEAVE = Chooser("aten::repeat_interleave")
_UNFOLD_BACKWARD = Chooser("aten::unfold_backward")
reset = resetting(_REPEAT_INTERLEAVE, _UNFOLD_BACKWARD)
COSTS: dict[str, CostFunction] = {
    "aten::repeat_interleave": repeat_interleave_cost,
    "aten::unfold_backward": unfold_backward_cost,
}


def _repeat_interleave(repeats: torch.Tensor, *, output_size: Optional[int] = None) -> torch.Tensor:
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("repeats has to be Long or Int tensor")
    if repeats.numel() == 0:
        record("fixed", "aten::repeat_interleave.Tensor")
        return torch.zeros(0, dtype=repeats.dtype, device=repeats.device)
    key = (*shapes(repeats), output_size is None)
    if not _REPEAT_INTERLEAVE.on_device(
        key, lambda: repeat_interleave_cost(repeats, output_size=output_size)
    ):
        operator = torch.ops.aten.repeat_interleave.Tensor
        name = "aten::repeat_interleave.Tensor"
        return through_the_cpu(name, operator, (repeats,), output_size=output_size)
    record("fixed", "aten::repeat_interleave.Tensor")
    if bool((repeats < 0).any()):
        raise RuntimeError("repeats can not be negative")
    ends = torch.cumsum(repeats.long(), 0)
    total = int(ends[-1]) if output_size is None else output_size
    # One more slot than the output, so that the totals of trailing zero repeats land outside.
    steps = torch.zeros(total + 1, dtype=torch.long, device=repeats.device)
    steps.scatter_add_(0, ends[:-1].clamp(max=total), torch.ones_like(ends[:-1]))
    return torch.cumsum(steps[:total], 0).to(repeats.dtype)


def _count_nonzero(self: torch.Tensor, dim: list[int]) -> torch.Tensor:
    record("fixed", "aten::count_nonzero.dim_IntList")
    return torch.ne(self, 0).sum(dim, dtype=torch.long)


def _nearest_indices(
    input_size: int, output_size: int, scale: Optional[float], device: torch.device
) -> torch.Tensor:
    """The CPU kernel's ``nearest_idx`` for every output position."""
    positions = torch.arange(output_size, device=device)
    if output_size == input_size:
        return positions
    if output_size == 2 * input_size:
        return torch.div(positions, 2, rounding_mode="floor")
    factor = 1.0 / scale if scale is not None and scale > 0 else input_size / output_size
    as_float = positions.to(torch.float32) * torch.tensor(factor, dtype=torch.float32)
    return torch.floor(as_float).long().clamp(max=input_size - 1)


def _upsample_nearest1d_out(
    self: torch.Tensor,
    output_size: list[int],
    scales: Optional[float] = None,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    record("fixed", "aten::upsample_nearest1d.out")
    indices = _nearest_indices(self.shape[-1], output_size[0], scales, self.device)
    return into(out, self.index_select(-1, indices))


def _upsample_nearest1d(
    self: torch.Tensor, output_size: list[int], scales: Optional[float] = None
) -> torch.Tensor:
    return _upsample_nearest1d_out(self, output_size, scales, out=self.new_empty(0))


def _upsample_nearest1d_backward_out(
    grad_output: torch.Tensor,
    output_size: list[int],
    input_size: list[int],
    scales: Optional[float] = None,
    *,
    grad_input: torch.Tensor,
) -> torch.Tensor:
    record("fixed", "aten::upsample_nearest1d_backward.grad_input")
    indices = _nearest_indices(input_size[-1], output_size[0], scales, grad_output.device)
    gradient = grad_output.new_zeros(input_size)
    gradient.scatter_add_(-1, indices.expand_as(grad_output), grad_output)
    return into(grad_input, gradient)


def _upsample_nearest1d_backward(
    grad_output: torch.Tensor,
    output_size: list[int],
    input_size: list[int],
    scales: Optional[float] = None,
) -> torch.Tensor:
    return _upsample_nearest1d_backward_out(
        grad_output, output_size, input_size, scales, grad_input=grad_output.new_empty(0)
    )


def _unfold_backward(
    grad_in: torch.Tensor, input_sizes: list[int], dim: int, size: int, step: int
) -> torch.Tensor:
    arguments = (grad_in, input_sizes, dim, size, step)
    key = (*shapes(grad_in), tuple(input_sizes), dim, size, step)
    if not _UNFOLD_BACKWARD.on_device(key, lambda: unfold_backward_cost(*arguments)):
        return through_the_cpu("aten::unfold_backward", torch.ops.aten.unfold_backward, arguments)
    record("fixed", "aten::unfold_backward")
    if not input_sizes:  # a 0-d tensor's one window of one value
        return grad_in.reshape(())
    dim = dim % len(input_sizes)
    length = input_sizes[dim]
    windows = grad_in.shape[dim]
    # [..., windows, size]: the windows along the second-last dimension, their positions last.
    grads = grad_in.movedim(dim, -2)
    lead = grads.shape[:-2]
    out = grads.new_zeros(*lead, length)
    if size % step == 0:
        # Window w's block b (of `step` values) lands at (w + b) * step: one shifted slice per b.
        blocks = grads.reshape(*lead, windows, size // step, step)
        for b in range(size // step):
            piece = blocks[..., b, :].reshape(*lead, windows * step)
            out[..., b * step : b * step + windows * step] += piece
    else:
        offsets = torch.arange(size, device=grads.device)
        starts = torch.arange(windows, device=grads.device) * step
        index = (starts.unsqueeze(1) + offsets.unsqueeze(0)).reshape(-1)
        values = grads.reshape(*lead, windows * size)
        out.scatter_add_(-1, index.expand_as(values), values)
    return out.movedim(-1, dim)


def _roll(self: torch.Tensor, shifts: list[int], dims: Optional[list[int]] = None) -> torch.Tensor:
    record("fixed", "aten::roll")
    if not dims:
        if len(shifts) != 1:
            raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:0")
        return _roll(self.flatten(), shifts, [0]).view(self.shape)
    if len(shifts) != len(dims):
        raise RuntimeError(
            f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}"
        )
    out = self
    for shift, dim in zip(shifts, dims):
        size = out.shape[dim]
        cut = shift % size if size else 0
        if cut:
            out = torch.cat((out.narrow(dim, size - cut, cut), out.narrow(dim, 0, size - cut)), dim)
    return out.clone() if out is self else out


def _index_add_out(
    self: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    source: torch.Tensor,
    *,
    alpha: float = 1,
    out: torch.Tensor,
) -> torch.Tensor:
    record("fixed", "aten::index_add.out")
    if index.dim() > 1:
        raise IndexError("index_add_(): Index is supposed to be a vector")
    dim = dim % max(self.dim(), 1)
    values = source if alpha == 1 else source * alpha
    if self.dim() == 0:
        spread = index.reshape(values.shape)
    else:
        shape = [1] * values.dim()
        shape[dim] = index.numel()
        spread = index.reshape(shape).expand_as(values)
    if out is not self:
        into(out, self)
    return out.scatter_add_(dim, spread.to(out.device), values)


KERNELS = (
    Kernel("index_add.out", _index_add_out, "fallback"),
    Kernel("index_add", functional(_index_add_out), "fallback"),
    Kernel("index_add_", in_place(_index_add_out), "fallback"),
    Kernel("roll", _roll, "fallback"),
    Kernel("unfold_backward", _unfold_backward, "fallback"),
    Kernel("repeat_interleave.Tensor", _repeat_interleave, "fallback"),
    Kernel("count_nonzero.dim_IntList", _count_nonzero, "fallback"),
    Kernel("upsample_nearest1d.out", _upsample_nearest1d_out, "fallback"),
    Kernel("upsample_nearest1d", _upsample_nearest1d, "fallback"),
    Kernel("upsample_nearest1d_backward.grad_input", _upsample_nearest1d_backward_out, "fallback"),
    Kernel("upsample_nearest1d_backward", _upsample_nearest1d_backward, "fallback"),
)
