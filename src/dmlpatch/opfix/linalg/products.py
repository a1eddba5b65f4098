"""``dot``, ``vdot`` and ``linalg_cross``, which torch-directml 0.2.5 runs on the CPU, on
the device.

Geometry code (kornia's conversions, epipolar geometry, camera models) takes cross products of
3-vectors and dot products in every call; DirectML registers ``dot.out`` but not ``dot``
itself, and no cross product, so each call copies its operands to the host and back.

=========== ======================================================================================
dot         a ``(1, n) @ (n, 1)`` matrix product for floats (BLAS's dot, as the CPU's), the sum of
            the products for integers; the CPU's checks and messages
vdot        ``dot`` for real vectors (``torch.linalg.vecdot`` of two vectors calls it)
linalg_cross ``a[i+1] * b[i+2] - a[i+2] * b[i+1]`` along ``dim`` after broadcasting (the CPU
            kernel's formula), in its three forms; ``torch.cross`` calls it
=========== ======================================================================================
"""

from __future__ import annotations

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def _dot(self: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    _check_vectors(self, tensor)
    record("fixed", "aten::dot")
    return _product(self, tensor)


def _vdot(self: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    if self.is_complex() or tensor.is_complex():  # the conjugate's: vdot's reason to exist
        return through_the_cpu("aten::vdot", torch.ops.aten.vdot, (self, tensor))
    _check_vectors(self, tensor)
    record("fixed", "aten::vdot")
    return _product(self, tensor)


def _check_vectors(self: torch.Tensor, tensor: torch.Tensor) -> None:
    """The CPU's checks and messages (vdot's are dot's)."""
    if self.dim() != 1 or tensor.dim() != 1:
        raise RuntimeError(
            f"1D tensors expected, but got {self.dim()}D and {tensor.dim()}D tensors"
        )
    if self.dtype != tensor.dtype:
        raise RuntimeError(
            "dot : expected both vectors to have same dtype, but found "
            f"{_c10_name(self.dtype)} and {_c10_name(tensor.dtype)}"
        )
    if self.numel() != tensor.numel():
        raise RuntimeError(
            f"inconsistent tensor size, expected tensor [{self.numel()}] and src "
            f"[{tensor.numel()}] to have the same number of elements, but got {self.numel()} "
            f"and {tensor.numel()} elements respectively"
        )


def _product(self: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    if self.is_floating_point():
        # Not through dot.out: where that is PyTorch's out= wrapper around dot (the simulator's
        # CPU kernel), it would call this kernel again.
        return (self.unsqueeze(0) @ tensor.unsqueeze(1)).reshape(())
    return (self * tensor).sum(dtype=self.dtype)


def _c10_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``Float``, as c10 names it in messages."""
    names = {
        torch.float32: "Float",
        torch.float64: "Double",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.int64: "Long",
        torch.int32: "Int",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.bool: "Bool",
    }
    return names.get(dtype, str(dtype).replace("torch.", ""))


def _linalg_cross_out(
    self: torch.Tensor, other: torch.Tensor, *, dim: int = -1, out: torch.Tensor
) -> torch.Tensor:
    if self.dim() != other.dim():
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    record("fixed", "aten::linalg_cross.out")
    a, b = torch.broadcast_tensors(self, other)
    dim = dim % max(a.dim(), 1)
    if self.shape[dim] != 3 or other.shape[dim] != 3:
        raise RuntimeError(
            f"linalg.cross: inputs dimension {dim} must have length 3. Got "
            f"{self.shape[dim]} and {other.shape[dim]}"
        )
    dtype = torch.result_type(self, other)
    a, b = a.to(dtype), b.to(dtype)
    parts = [
        a.narrow(dim, (i + 1) % 3, 1) * b.narrow(dim, (i + 2) % 3, 1)
        - a.narrow(dim, (i + 2) % 3, 1) * b.narrow(dim, (i + 1) % 3, 1)
        for i in range(3)
    ]
    return into(out, torch.cat(parts, dim))


def _linalg_cross(self: torch.Tensor, other: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
    out = self.new_empty(0, dtype=torch.result_type(self, other))
    return _linalg_cross_out(self, other, dim=dim, out=out)


NO_CHOICE = (
    "a dot or cross product is one to a dozen elementwise kernels, which cost less than the "
    "fallback's read-back of each operand, and its bytes cross the device's memory faster "
    "than the link the fallback copies them over"
)

KERNELS = (
    Kernel("dot", _dot, "fallback"),
    Kernel("vdot", _vdot, "fallback"),
    Kernel("linalg_cross.out", _linalg_cross_out, "fallback"),
    Kernel("linalg_cross", _linalg_cross, "fallback"),
)
