"""``torch.linalg.eig`` and ``eigvals`` of general matrices: through the CPU, by dmlpatch.

torch-directml 0.2.5 has no kernel for them, and its CPU fallback cannot finish the call: the
eigenvalues of a real matrix are complex, DirectML holds no complex tensor, and moving the
result back fails (``RuntimeError: Invalid or unsupported data type ComplexFloat.``; kornia's
five-point solver, any stability check of a linear system). dmlpatch holds complex tensors on
the device (:mod:`dmlpatch.opfix.tensors.allocation`), so here the decomposition runs on the
CPU and its complex results come back to the device, counted and said as the fallback it is:
a general eigenproblem is Hessenberg reduction and shifted QR iterations, a chain of scalar
steps with no composition of whole-matrix kernels that would be faster than the copies.
PyTorch's CUDA build does the same: MAGMA has no device interface for ``geev``, so
``linalg_eig`` and ``linalg_eigvals`` copy the matrix to the host there too
(``aten/src/ATen/native/BatchLinearAlgebra.cpp``).
"""

from __future__ import annotations

import torch

from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def _eig(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return through_the_cpu("aten::linalg_eig", torch.ops.aten.linalg_eig, (a,))


def _eigvals(a: torch.Tensor) -> torch.Tensor:
    return through_the_cpu("aten::_linalg_eigvals", torch.ops.aten._linalg_eigvals, (a,))


NO_CHOICE = (
    "no composition: every call already goes through the CPU, dmlpatch's own way, because "
    "DirectML's fallback cannot return the complex results"
)

KERNELS = (
    Kernel("linalg_eig", _eig, "fallback"),
    Kernel("_linalg_eigvals", _eigvals, "fallback"),
)
