"""Operators torch-directml 0.2.5 lacks and runs through its CPU fallback, composed on the device.

A CPU fallback costs a copy of every argument to the host and of every result back, per call.
These are the ones a YOLO training step meets every step (SiLU's backward through every conv
block, the EMA's ``lerp_`` over every parameter, ``bincount`` in the target assigner) and the
small ones around them. A structured operator is served in all three forms (functional,
in-place, ``out=``; calls are counted under the ``out=`` name, as DirectML's fallback reports
them), and each kernel computes what the CPU kernel computes, in the same order of operations.

====================== ==========================================================================
silu_backward          ``g * s * (1 + x * (1 - s))`` with ``s = sigmoid(x)`` (the CPU formula)
lerp (scalar, tensor)  ``a + w * (b - a)`` where ``|w| < 0.5``, else ``b - (b - a) * (1 - w)``
nan_to_num             ``masked_fill`` of NaN, +inf and -inf (defaults: 0, the dtype's max/min)
addmv                  ``beta * self + alpha * (mat @ vec)`` through ``mm``
bincount               ``scatter_add`` of ones (or weights) into a zero vector
log_sigmoid            ``min(x, 0) - log1p(z)``, ``z = exp(-|x|)`` kept as the buffer, and its
                       backward (BCE-with-logits in every YOLO loss)
====================== ==========================================================================
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, functional, in_place, into


def _silu_backward(
    grad_output: torch.Tensor, self: torch.Tensor, *, grad_input: torch.Tensor
) -> torch.Tensor:
    record("fixed", "aten::silu_backward.grad_input")
    sigmoid = torch.sigmoid(self)
    return into(grad_input, grad_output * sigmoid * (1 + self * (1 - sigmoid)))


def _lerp(
    start: torch.Tensor, end: torch.Tensor, weight: Union[float, torch.Tensor]
) -> torch.Tensor:
    # The CPU kernel switches formula at |weight| = 0.5 so that weight 1 gives `end` exactly.
    if isinstance(weight, torch.Tensor):
        small = weight.abs() < 0.5
        low = start + weight * (end - start)
        high = end - (end - start) * (1 - weight)
        return torch.where(small, low, high)
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1 - weight)


def _lerp_scalar_out(
    self: torch.Tensor, end: torch.Tensor, weight: float, *, out: torch.Tensor
) -> torch.Tensor:
    record("fixed", "aten::lerp.Scalar_out")
    return into(out, _lerp(self, end, float(weight)))


def _lerp_tensor_out(
    self: torch.Tensor, end: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    record("fixed", "aten::lerp.Tensor_out")
    return into(out, _lerp(self, end, weight))


def _nan_to_num_out(
    self: torch.Tensor,
    nan: Optional[float] = None,
    posinf: Optional[float] = None,
    neginf: Optional[float] = None,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    record("fixed", "aten::nan_to_num.out")
    if not self.is_floating_point():
        return into(out, self.clone())
    info = torch.finfo(self.dtype)
    result = self.masked_fill(self != self, 0.0 if nan is None else nan)
    result = result.masked_fill(result == float("inf"), info.max if posinf is None else posinf)
    result = result.masked_fill(result == float("-inf"), info.min if neginf is None else neginf)
    return into(out, result)


def _addmv_out(
    self: torch.Tensor,
    mat: torch.Tensor,
    vec: torch.Tensor,
    *,
    beta: float = 1,
    alpha: float = 1,
    out: torch.Tensor,
) -> torch.Tensor:
    record("fixed", "aten::addmv.out")
    if not (out.is_floating_point() or out.is_complex()):
        # The CPU converts the scalars to the integral dtype first (0.6 is 0), as C++ casts.
        alpha, beta = (
            (bool(alpha), bool(beta)) if out.dtype is torch.bool else (int(alpha), int(beta))
        )
    product = torch.mm(mat, vec.unsqueeze(1)).squeeze(1)
    if alpha != 1:
        product = product * alpha
    # beta == 0 ignores self entirely (NaN in self must not leak), as BLAS does.
    result = product if beta == 0 else product + (self if beta == 1 else self * beta)
    return into(out, result.expand(out.shape) if out.numel() and result.dim() == 0 else result)


def _bincount(
    self: torch.Tensor, weights: Optional[torch.Tensor] = None, minlength: int = 0
) -> torch.Tensor:
    if self.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if self.is_floating_point() or self.is_complex():
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and weights.shape != self.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    record("fixed", "aten::bincount")
    if self.numel() and bool((self < 0).any()):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    size = max(minlength, int(self.max()) + 1 if self.numel() else 0)
    if weights is None:
        dtype, values = torch.long, torch.ones_like(self, dtype=torch.long)
    else:
        # The CPU kernel keeps float32 weights as float32 and widens every other type to double.
        dtype = torch.float if weights.dtype == torch.float else torch.double
        values = weights.to(dtype)
    zeros = torch.full((size,), 0, dtype=dtype, device=self.device)
    return torch.scatter_add(zeros, 0, self.long(), values)


def _log_sigmoid(self: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    buffer = torch.exp(-self.abs())
    return torch.clamp_max(self, 0) - torch.log1p(buffer), buffer


def _log_sigmoid_forward(self: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    record("fixed", "aten::log_sigmoid_forward")
    return _log_sigmoid(self)


def _log_sigmoid_forward_output(
    self: torch.Tensor, *, output: torch.Tensor, buffer: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    record("fixed", "aten::log_sigmoid_forward")
    result, z = _log_sigmoid(self)
    return into(output, result), into(buffer, z)


def _log_sigmoid_gradient(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    # The CPU kernel recomputes z from x rather than trusting the buffer; so does this.
    negative = self < 0
    max_deriv = negative.to(self.dtype)
    sign = torch.where(negative, 1.0, -1.0).to(self.dtype)
    z = torch.exp(-self.abs())
    return grad_output * (max_deriv - sign * (z / (1 + z)))


def _log_sigmoid_backward(
    grad_output: torch.Tensor, self: torch.Tensor, buffer: torch.Tensor
) -> torch.Tensor:
    record("fixed", "aten::log_sigmoid_backward")
    return _log_sigmoid_gradient(grad_output, self)


def _log_sigmoid_backward_out(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    buffer: torch.Tensor,
    *,
    grad_input: torch.Tensor,
) -> torch.Tensor:
    record("fixed", "aten::log_sigmoid_backward")
    return into(grad_input, _log_sigmoid_gradient(grad_output, self))


def _silu_backward_functional(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    return _silu_backward(grad_output, self, grad_input=grad_output.new_empty(0))


KERNELS = (
    Kernel("silu_backward.grad_input", _silu_backward, "fallback"),
    Kernel("silu_backward", _silu_backward_functional, "fallback"),
    Kernel("lerp.Scalar_out", _lerp_scalar_out, "fallback"),
    Kernel("lerp.Scalar", functional(_lerp_scalar_out), "fallback"),
    Kernel("lerp_.Scalar", in_place(_lerp_scalar_out), "fallback"),
    Kernel("lerp.Tensor_out", _lerp_tensor_out, "fallback"),
    Kernel("lerp.Tensor", functional(_lerp_tensor_out), "fallback"),
    Kernel("lerp_.Tensor", in_place(_lerp_tensor_out), "fallback"),
    Kernel("nan_to_num.out", _nan_to_num_out, "fallback"),
    Kernel("nan_to_num", functional(_nan_to_num_out), "fallback"),
    Kernel("nan_to_num_", in_place(_nan_to_num_out), "fallback"),
    Kernel("addmv.out", _addmv_out, "fallback"),
    Kernel("addmv", functional(_addmv_out), "fallback"),
    Kernel("addmv_", in_place(_addmv_out), "fallback"),
    Kernel("bincount", _bincount, "fallback"),
    Kernel("log_sigmoid_forward", _log_sigmoid_forward, "fallback"),
    Kernel("log_sigmoid_forward.output", _log_sigmoid_forward_output, "fallback"),
    Kernel("log_sigmoid_backward", _log_sigmoid_backward, "fallback"),
    Kernel("log_sigmoid_backward.grad_input", _log_sigmoid_backward_out, "fallback"),
)
