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

Each is a few kernels and no read-back, where the fallback reads back every tensor argument
and copies it over the bus; but the compositions read and write memory several times over
(``log_sigmoid_backward``: 13 kernels, 83 bytes an element), so on an adapter whose memory is
little faster than its bus (an integrated GPU) a large one can be cheaper through the CPU, and
``bincount`` reads back its range where the fallback reads its input: the cost model chooses
per call (:data:`COSTS`). ``addmv`` is a matrix product against a copy of the whole matrix:
always the composition.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, functional, in_place, into
from dmlpatch.opfix.cost_terms import TRANSCENDENTAL, elementwise, fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: Floating dtypes the compositions compute in float32, as the CPU's and CUDA's kernels do.
_REDUCED = (torch.float16, torch.bfloat16)

# ---- what the compositions cost: kernels and bytes an element counted from their code
# (float32), against the fallback's copies and its arithmetic on the host ----


def silu_backward_cost(
    grad_output: torch.Tensor, self: torch.Tensor, *, grad_input: torch.Tensor
) -> Costs:
    """A sigmoid and five products and sums, then the copy into ``grad_input``."""
    n, size = self.numel(), self.element_size()
    host = n * (TRANSCENDENTAL + 4.0)
    return Costs(
        elementwise(7, n, 68, size), fallback(grad_output, self, up=n * size, host_flops=host)
    )


def lerp_cost(
    self: torch.Tensor, end: torch.Tensor, weight: Union[float, torch.Tensor], *, out: torch.Tensor
) -> Costs:
    """A number weight: a difference, a product, a sum and the copy into ``out`` (4); a
    tensor weight: both formulas and the choice between them (11). float16 and bfloat16 are
    computed in float32: a cast of each tensor argument first (6 bytes an element each), and
    the copy into ``out`` reads float32 and writes 2 bytes."""
    shape = torch.broadcast_shapes(
        self.shape, end.shape, weight.shape if isinstance(weight, torch.Tensor) else ()
    )
    n, size = math.prod(shape), out.element_size()
    tensor = isinstance(weight, torch.Tensor)
    launches, moved = (11, 102) if tensor else (4, 40)
    if self.dtype in _REDUCED or end.dtype in _REDUCED:
        casts = 3 if tensor else 2
        # In float32 bytes: the casts, and the last copy's 6 bytes where float32's has 8.
        device = elementwise(launches + casts, n, moved + 6 * casts - 2)
    else:
        device = elementwise(launches, n, moved, size)
    return Costs(device, fallback(self, end, weight, up=n * size, host_flops=4.0 * n))


def nan_to_num_cost(
    self: torch.Tensor,
    nan: Optional[float] = None,
    posinf: Optional[float] = None,
    neginf: Optional[float] = None,
    *,
    out: torch.Tensor,
) -> Costs:
    """Three comparisons and fills (10 kernels with the copy into ``out``); a clone for
    integers. DirectML's fallback copies ``out`` down too, which its functional form makes the
    size of the result."""
    n, size = self.numel(), self.element_size()
    device = elementwise(10, n, 62, size) if self.is_floating_point() else elementwise(2, n, 16)
    through = fallback(self, up=n * size, host_flops=3.0 * n)
    if out is not self:
        through = through._replace(down_bytes=2 * n * size, arguments=through.arguments + 1)
    return Costs(device, through)


def bincount_cost(
    self: torch.Tensor, weights: Optional[torch.Tensor] = None, minlength: int = 0
) -> Costs:
    """The check for negative values and the largest value (3 kernels, two read-backs), the
    counts' zeros, the ones (or the weights cast), the index widened from int32, one
    ``scatter_add``. The fallback copies the input (and weights) down and ``minlength`` counts
    up (more where a value is larger, which only the values say)."""
    n = self.numel()
    casts = (0 if weights is not None and weights.dtype == torch.float else 1) + (
        0 if self.dtype == torch.int64 else 1
    )
    reads = 2 if n else 0
    device = OnDevice(5 + casts, reads, n * (24.0 + 8 * casts) + 8.0 * minlength, 4.0 * n)
    return Costs(device, fallback(self, weights, up=8.0 * minlength, host_flops=2.0 * n))


def log_sigmoid_forward_cost(self: torch.Tensor) -> Costs:
    """``exp(-|x|)``, ``log1p``, ``min(x, 0)`` and the difference (6 kernels); the fallback
    brings the result and the buffer back."""
    n, size = self.numel(), self.element_size()
    host = n * (2.0 * TRANSCENDENTAL + 3)
    return Costs(elementwise(6, n, 48, size), fallback(self, up=2 * n * size, host_flops=host))


def log_sigmoid_backward_cost(
    grad_output: torch.Tensor, self: torch.Tensor, buffer: torch.Tensor
) -> Costs:
    """The sign, ``exp(-|x|)`` recomputed, the derivative and the product (13 kernels)."""
    n, size = self.numel(), self.element_size()
    host = n * (TRANSCENDENTAL + 6.0)
    return Costs(
        elementwise(13, n, 83, size),
        fallback(grad_output, self, buffer, up=n * size, host_flops=host),
    )


def _log_sigmoid_forward_output_cost(
    self: torch.Tensor, *, output: torch.Tensor, buffer: torch.Tensor
) -> Costs:
    device, through = log_sigmoid_forward_cost(self)
    moved = fallback(self, output, buffer, up=through.up_bytes, host_flops=through.host_flops)
    return Costs(device._replace(launches=device.launches + 2), moved)


COSTS: dict[str, CostFunction] = {
    "aten::silu_backward": silu_backward_cost,
    "aten::lerp": lerp_cost,
    "aten::nan_to_num": nan_to_num_cost,
    "aten::bincount": bincount_cost,
    "aten::log_sigmoid_forward": log_sigmoid_forward_cost,
    "aten::log_sigmoid_backward": log_sigmoid_backward_cost,
}
_SILU_BACKWARD = Chooser("aten::silu_backward")
_LERP = Chooser("aten::lerp")
_NAN_TO_NUM = Chooser("aten::nan_to_num")
_BINCOUNT = Chooser("aten::bincount")
_LOG_SIGMOID_FORWARD = Chooser("aten::log_sigmoid_forward")
_LOG_SIGMOID_BACKWARD = Chooser("aten::log_sigmoid_backward")
reset = resetting(
    _SILU_BACKWARD, _LERP, _NAN_TO_NUM, _BINCOUNT, _LOG_SIGMOID_FORWARD, _LOG_SIGMOID_BACKWARD
)


def _weight_key(weight: Union[float, torch.Tensor]) -> object:
    """A number weight's formula (which side of 0.5), or a tensor weight's shape."""
    if isinstance(weight, torch.Tensor):
        return shapes(weight)
    return abs(weight) < 0.5


def _silu_backward(
    grad_output: torch.Tensor, self: torch.Tensor, *, grad_input: torch.Tensor
) -> torch.Tensor:
    key = shapes(grad_output, self)
    if not _SILU_BACKWARD.on_device(
        key, lambda: silu_backward_cost(grad_output, self, grad_input=grad_input)
    ):
        operator = torch.ops.aten.silu_backward.grad_input
        name = "aten::silu_backward.grad_input"
        return through_the_cpu(name, operator, (grad_output, self), grad_input=grad_input)
    record("fixed", "aten::silu_backward.grad_input")
    sigmoid = torch.sigmoid(self)
    return into(grad_input, grad_output * sigmoid * (1 + self * (1 - sigmoid)))


def _lerp(
    start: torch.Tensor, end: torch.Tensor, weight: Union[float, torch.Tensor]
) -> torch.Tensor:
    # The CPU kernel switches formula at |weight| = 0.5 so that weight 1 gives `end` exactly.
    # float16 and bfloat16 in float32 (the CPU's and CUDA's opmath): `end - start` of two
    # float16 values overflows from 32768 apart, and each operation's rounding would add up.
    if start.dtype in _REDUCED or end.dtype in _REDUCED:
        start, end = start.float(), end.float()
        if isinstance(weight, torch.Tensor):
            weight = weight.float()
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
    key = (*shapes(self, end, out), _weight_key(weight))
    if not _LERP.on_device(key, lambda: lerp_cost(self, end, weight, out=out)):
        operator = torch.ops.aten.lerp.Scalar_out
        return through_the_cpu("aten::lerp.Scalar_out", operator, (self, end, weight), out=out)
    record("fixed", "aten::lerp.Scalar_out")
    return into(out, _lerp(self, end, float(weight)))


def _lerp_tensor_out(
    self: torch.Tensor, end: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    key = (*shapes(self, end, out), _weight_key(weight))
    if not _LERP.on_device(key, lambda: lerp_cost(self, end, weight, out=out)):
        operator = torch.ops.aten.lerp.Tensor_out
        return through_the_cpu("aten::lerp.Tensor_out", operator, (self, end, weight), out=out)
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
    key = (*shapes(self, out), out is self)
    if not _NAN_TO_NUM.on_device(key, lambda: nan_to_num_cost(self, nan, posinf, neginf, out=out)):
        operator = torch.ops.aten.nan_to_num.out
        arguments = (self, nan, posinf, neginf)
        return through_the_cpu("aten::nan_to_num.out", operator, arguments, out=out)
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
    key = (*shapes(self, weights), minlength)
    if not _BINCOUNT.on_device(key, lambda: bincount_cost(self, weights, minlength)):
        operator = torch.ops.aten.bincount
        return through_the_cpu("aten::bincount", operator, (self, weights, minlength))
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
    if not _LOG_SIGMOID_FORWARD.on_device(shapes(self), lambda: log_sigmoid_forward_cost(self)):
        operator = torch.ops.aten.log_sigmoid_forward
        return through_the_cpu("aten::log_sigmoid_forward", operator, (self,))
    record("fixed", "aten::log_sigmoid_forward")
    return _log_sigmoid(self)


def _log_sigmoid_forward_output(
    self: torch.Tensor, *, output: torch.Tensor, buffer: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    key = (*shapes(self, output, buffer), "output")
    if not _LOG_SIGMOID_FORWARD.on_device(
        key, lambda: _log_sigmoid_forward_output_cost(self, output=output, buffer=buffer)
    ):
        operator = torch.ops.aten.log_sigmoid_forward.output
        name = "aten::log_sigmoid_forward.output"
        return through_the_cpu(name, operator, (self,), output=output, buffer=buffer)
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
    key = shapes(grad_output, self, buffer)
    if not _LOG_SIGMOID_BACKWARD.on_device(
        key, lambda: log_sigmoid_backward_cost(grad_output, self, buffer)
    ):
        operator = torch.ops.aten.log_sigmoid_backward
        arguments = (grad_output, self, buffer)
        return through_the_cpu("aten::log_sigmoid_backward", operator, arguments)
    record("fixed", "aten::log_sigmoid_backward")
    return _log_sigmoid_gradient(grad_output, self)


def _log_sigmoid_backward_out(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    buffer: torch.Tensor,
    *,
    grad_input: torch.Tensor,
) -> torch.Tensor:
    key = (*shapes(grad_output, self, buffer), "grad_input")
    if not _LOG_SIGMOID_BACKWARD.on_device(
        key, lambda: log_sigmoid_backward_cost(grad_output, self, buffer)
    ):
        operator = torch.ops.aten.log_sigmoid_backward.grad_input
        name = "aten::log_sigmoid_backward.grad_input"
        arguments = (grad_output, self, buffer)
        return through_the_cpu(name, operator, arguments, grad_input=grad_input)
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
