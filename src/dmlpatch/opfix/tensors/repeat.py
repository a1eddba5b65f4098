"""``repeat`` to more than 4 dimensions on the device.

DirectML's ``repeat`` refuses results of more than 4 dimensions ("the dimesion of at::Tensor
must be 4 or lower, but got 5", sic). The fix repeats one dimension at a time, each step on a
3-D view: with ``A`` the size before dimension ``i`` and ``B`` the elements from ``i`` on,
repeating ``i`` ``r`` times is ``x.reshape(A, 1, B).expand(A, r, B)``, read back in order. No
intermediate has more than 3 dimensions, and autograd differentiates through reshape and
expand (the gradient of expand is a sum).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel

#: The highest rank DirectML's repeat accepts.
DIRECTML_MAX_RANK = 4


def repeat_by_steps(self: torch.Tensor, repeats: Sequence[int]) -> torch.Tensor:
    """``self.repeat(repeats)`` composed of reshape and expand."""
    if len(repeats) < self.dim():
        raise RuntimeError(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions "
            "of tensor"
        )
    if any(r < 0 for r in repeats):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(repeats)}")
    shape = [1] * (len(repeats) - self.dim()) + list(self.shape)
    result = self.reshape(shape)
    copied = False
    for i, times in enumerate(repeats):
        if times == 1:
            continue
        before = math.prod(shape[:i])
        rest = math.prod(shape[i:])
        # Reading an expanded view back into a shape copies it.
        result = result.reshape(before, 1, rest).expand(before, times, rest)
        shape[i] *= times
        result = result.reshape(shape)
        copied = True
    # repeat always returns a new tensor, never a view of its input.
    return result if copied else result.clone()


def _repeat(self: torch.Tensor, repeats: Sequence[int]) -> torch.Tensor:
    if max(self.dim(), len(repeats)) <= DIRECTML_MAX_RANK:
        out = self.new_empty(0)
        torch.ops.aten.repeat.out(self, repeats, out=out)
        return out
    record("fixed", "aten::repeat")
    return repeat_by_steps(self, repeats).contiguous()


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = "DirectML refuses a repeat to more than 4 dimensions: there is no fallback to choose."

KERNELS = (Kernel("repeat", _repeat, "refused"),)
