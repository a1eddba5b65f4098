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
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, functional, in_place, into


def _repeat_interleave(repeats: torch.Tensor, *, output_size: Optional[int] = None) -> torch.Tensor:
    record("fixed", "aten::repeat_interleave.Tensor")
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("repeats has to be Long or Int tensor")
    if repeats.numel() == 0:
        return torch.zeros(0, dtype=repeats.dtype, device=repeats.device)
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
