"""``torch.linalg.matrix_exp`` on the device: scaling and squaring of a Taylor polynomial.

torch-directml 0.2.5 has no matrix exponential: every call copies through the CPU, and
``nn.utils.parametrizations.orthogonal`` calls it on every forward pass of a square weight
(its default map), as Lie-group code does for rotations. Here ``A`` is halved ``s`` times, until
its 1-norm is at most 1, the exponential of the small matrix is its Taylor polynomial (degree 18
for float64, 12 for float32: the first term left out is below the dtype's rounding), evaluated
by Horner's rule with matrix products, and squared back ``s`` times. ``s`` is the one value
read back to the host (the batch's largest norm decides it for the whole batch, as extra
squarings cost rounding only at the last bits). The result equals the CPU's to the rounding of
the exponential's own conditioning, and autograd differentiates it with PyTorch's formula (the
exponential of a block matrix twice the size, here as well). The composition is some forty
kernels whatever the width, so the cost model (``COSTS``, :mod:`dmlpatch.costs.choice`) takes
it where the host's products would cost more: on the shipped adapter profiles, matrices of
about 60 columns and more, and batches of tens of thousands of 3x3; the fallback otherwise
(``DMLPATCH_DEVICE_OPS`` keeps the composition).

Matrices wider than :data:`WIDEST`, non-finite ones and dtypes other than float32 and float64
go through the CPU as DirectML's fallback would, counted and said as one;
``DMLPATCH_CPU_OPS=aten::linalg_matrix_exp`` sends all of them there.
"""

from __future__ import annotations

import math

import torch

from dmlpatch.costs.choice import Chooser, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.linalg import call_costs
from dmlpatch.opfix.linalg.operands import square_floats
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: The widest matrix exponentiated on the device (the backward's block matrix is twice this).
WIDEST = 128
_DEGREES = {torch.float32: 12, torch.float64: 18}

_EXP = Chooser("aten::linalg_matrix_exp")


def exponential(a: torch.Tensor, squarings: int) -> torch.Tensor:
    """``exp(a)`` for ``a`` whose 1-norm is at most ``2 ** squarings``."""
    small = a * (0.5**squarings)
    identity = torch.zeros_like(a, memory_format=torch.contiguous_format)
    identity.diagonal(dim1=-2, dim2=-1).fill_(1)
    result = identity
    for k in range(_DEGREES[a.dtype], 0, -1):
        result = identity + (small @ result) / k
    for _ in range(squarings):
        result = result @ result
    return result


def _matrix_exp(a: torch.Tensor) -> torch.Tensor:
    if (
        square_floats(a, WIDEST)
        and a.numel() > 0
        and _EXP.on_device((a.shape, a.dtype), lambda: matrix_exp_cost(a))
    ):
        largest = float(a.abs().sum(-2).amax())  # the 1-norm, the one value read back
        if math.isfinite(largest):
            record("fixed", "aten::linalg_matrix_exp")
            squarings = max(0, math.ceil(math.log2(largest))) if largest > 0 else 0
            return exponential(a, squarings)
    return through_the_cpu("aten::linalg_matrix_exp", torch.ops.aten.linalg_matrix_exp, (a,))


def matrix_exp_cost(a: torch.Tensor) -> Costs:
    """Per Taylor term a product, a division and a sum (three kernels), one product per
    squaring, the norm read back. Squarings: ``log2(n) + 1``, typical of entries about one
    (the 1-norm, of about ``n``, decides them)."""
    n, batch = a.shape[-1], call_costs.matrices(a.shape)
    degree = _DEGREES[a.dtype]
    squarings = math.log2(n) + 1
    flops = batch * (degree + squarings) * 2 * n**3
    # The CPU's kernel: a degree-18 Taylor polynomial in six products (Bader, Blanes and
    # Casas), and the squarings.
    host_flops = batch * (6 + squarings) * 2 * n**3
    return Costs(
        call_costs.composition(
            6 + 3 * degree + squarings,
            1,
            batch=batch,
            itemsize=a.element_size(),
            elements=2.5 * n * n,
            flops=flops,
        ),
        call_costs.fallback((a,), a.numel() * a.element_size(), host_flops),
    )


def reset() -> None:
    _EXP.reset()


COSTS = {"aten::linalg_matrix_exp": matrix_exp_cost}

KERNELS = (Kernel("linalg_matrix_exp", _matrix_exp, "fallback"),)
