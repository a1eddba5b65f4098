"""What one linalg call costs either way, in the cost model's terms
(:mod:`dmlpatch.costs.choice`): the pieces every fix's cost functions share.

A composition's kernel launches and read-backs are counted from its code (loops over columns,
rows, sweeps and rounds), in each fix module. Its bytes are the launches times the elements a
kernel of it touches per matrix, a column's worth (``c * n``) for the column-by-column
compositions and a matrix's (``c * n^2``) for Jacobi's whole-matrix rounds, ``c`` read off
what the simulated device charges them (within a factor of two; the bytes decide only for
batches of many thousands of matrices, where the launches no longer do). The fallback's side
is what DirectML's does: every device argument copied down (each a read-back), the results
copied back, and LAPACK's operation on the host, priced by its usual flop count (Golub and
Van Loan, *Matrix Computations*, 4th ed.) once per matrix of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dmlpatch.costs.choice import OnDevice, ThroughTheCpu

#: Bytes of LAPACK's ``int32`` pivots and ``info``.
INDEX_BYTES = 4


def matrices(shape: Sequence[int]) -> int:
    """How many matrices a ``(..., rows, columns)`` shape holds (1 for a plain matrix)."""
    count = 1
    for size in shape[:-2]:
        count *= size
    return count


def composition(
    launches: float,
    readbacks: float,
    *,
    batch: int,
    itemsize: int,
    elements: float,
    flops: float,
) -> OnDevice:
    """A composition's cost: ``launches`` kernels each touching ``elements`` elements of every
    matrix of the ``batch`` (read and written), ``readbacks`` values waited for, ``flops``
    in all."""
    return OnDevice(launches, readbacks, launches * batch * elements * itemsize, flops)


def together(*parts: OnDevice) -> OnDevice:
    """The cost of compositions run one after the other."""
    return OnDevice(
        sum(part.launches for part in parts),
        sum(part.readbacks for part in parts),
        sum(part.bytes for part in parts),
        sum(part.flops for part in parts),
        any(part.half for part in parts),
    )


def fallback(arguments: Sequence[Any], up_bytes: float, host_flops: float) -> ThroughTheCpu:
    """DirectML's fallback of a call whose device tensors are ``arguments`` (others are
    ignored) and whose results hold ``up_bytes``: each tensor copied down, one read-back
    each."""
    tensors = [value for value in arguments if isinstance(value, torch.Tensor)]
    down = sum(t.numel() * t.element_size() for t in tensors)
    return ThroughTheCpu(down, up_bytes, len(tensors), host_flops)
