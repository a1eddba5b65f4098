"""``avg_pool2d``/``avg_pool3d`` with ``divisor_override`` on the device.

DirectML refuses ``divisor_override`` ("Divisor override isn't supported for DirectML.").
With it, each output is the window's sum divided by the given divisor, padding counted as
zeros. The fix pads explicitly (``constant_pad_nd``) so that every window lies inside the
input, then pools without padding: an average over full windows is the sum divided by the
window size, so ``sum / divisor = average * (window size / divisor)``. Integer tensors, whose
average would truncate, sum their windows through ``unfold`` and divide with truncation, as
the CPU kernel does.

The backward pass stays PyTorch's (``avg_pool*_backward`` with the divisor, which DirectML
registers and no report says it refuses).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _expand(values: Sequence[int], rank: int, default: Sequence[int]) -> list[int]:
    values = list(values) or list(default)
    return values * rank if len(values) == 1 else values


def _output_size(size: int, kernel: int, pad: int, stride: int, ceil_mode: bool) -> int:
    """PyTorch's ``pooling_output_shape`` (dilation 1)."""
    numerator = size + 2 * pad - (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = numerator // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def sum_divided(
    self: torch.Tensor,
    rank: int,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    divisor: int,
) -> torch.Tensor:
    """Window sums over the last ``rank`` dimensions divided by ``divisor``, as the CPU's
    ``avg_pool{rank}d(..., divisor_override=divisor)`` computes them."""
    if divisor == 0:
        raise RuntimeError("divisor must be not zero")
    kernel = _expand(kernel_size, rank, ())
    steps = _expand(stride, rank, kernel)
    pads = _expand(padding, rank, (0,))
    sizes = self.shape[-rank:]
    outs = [_output_size(sizes[i], kernel[i], pads[i], steps[i], ceil_mode) for i in range(rank)]
    # constant_pad_nd takes (before, after) pairs from the last dimension backwards; a negative
    # "after" crops input that no window reaches.
    pad_arg: list[int] = []
    for i in reversed(range(rank)):
        after = (outs[i] - 1) * steps[i] + kernel[i] - sizes[i] - pads[i]
        pad_arg += [pads[i], after]
    padded = torch.constant_pad_nd(self, pad_arg, 0)
    if self.is_floating_point():
        pool = torch.ops.aten.avg_pool2d if rank == 2 else torch.ops.aten.avg_pool3d
        average = pool(padded, kernel, steps, [0] * rank, False, True, None)
        return average * (math.prod(kernel) / divisor)
    windows = padded
    for i in range(rank):
        windows = windows.unfold(self.dim() - rank + i, kernel[i], steps[i])
    sums = windows.sum(dim=tuple(range(-rank, 0)))
    return torch.div(sums, divisor, rounding_mode="trunc")


def _native(
    rank: int,
    self: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
) -> torch.Tensor:
    """DirectML's own kernel, through the ``.out`` variant it registers."""
    out = self.new_empty(0)
    pool = torch.ops.aten.avg_pool2d if rank == 2 else torch.ops.aten.avg_pool3d
    pool.out(self, kernel_size, stride, padding, ceil_mode, count_include_pad, None, out=out)
    return out


def _avg_pool(rank: int) -> Callable[..., torch.Tensor]:
    name = f"aten::avg_pool{rank}d"

    def kernel(
        self: torch.Tensor,
        kernel_size: Sequence[int],
        stride: Sequence[int] = (),
        padding: Sequence[int] = (0,),
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: Optional[int] = None,
    ) -> torch.Tensor:
        if divisor_override is None:
            return _native(rank, self, kernel_size, stride, padding, ceil_mode, count_include_pad)
        record("fixed", name)
        return sum_divided(self, rank, kernel_size, stride, padding, ceil_mode, divisor_override)

    kernel.__name__ = f"avg_pool{rank}d"
    return kernel


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    'DirectML refuses divisor_override ("Divisor override isn\'t supported for DirectML."): '
    "there is no fallback to choose."
)

KERNELS = (
    Kernel("avg_pool2d", _avg_pool(2), "refused"),
    Kernel("avg_pool3d", _avg_pool(3), "refused"),
)
