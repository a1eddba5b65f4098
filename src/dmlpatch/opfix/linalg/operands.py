"""What the linalg fixes take on the device, in one place.

Every fix here composes one dtype family's kernels (float32 and float64: DirectML has no
complex tensors, and integer matrices have no decompositions) for matrices up to a size its
loops stay short for; any other call goes through the CPU as DirectML's fallback would. These
tests are what "the device takes it" means, so that every fix reads the same ones.
"""

from __future__ import annotations

import torch

#: The dtypes the fixes compute in.
FLOATS = (torch.float32, torch.float64)


def float_matrices(a: torch.Tensor) -> bool:
    """A float32 or float64 matrix, or batch of them, holding at least one element."""
    return a.dtype in FLOATS and a.dim() >= 2 and a.numel() > 0


def square(a: torch.Tensor) -> bool:
    """A matrix, or batch of them, with as many rows as columns."""
    return a.dim() >= 2 and a.shape[-1] == a.shape[-2]


def square_floats(a: torch.Tensor, widest: int) -> bool:
    """Square float32 or float64 matrices of 1 to ``widest`` rows (a batch may be empty)."""
    return square(a) and a.dtype in FLOATS and within(a.shape[-1], widest)


def within(width: int, widest: int) -> bool:
    """At least one and at most ``widest``: the sizes a fix's loop runs for."""
    return 0 < width <= widest
