"""Elementwise operators torch-directml 0.2.5 runs on the CPU, composed on the device.

DirectML registers ``clamp``, ``clamp_min`` and ``clamp_max`` with number bounds only, so a
bound that is a tensor (image code clipping to per-channel or per-pixel limits, box code to the
image size) copies both to the host; ``glu`` (the gated convolutions of Demucs, wav2vec2 and
the Conformer family) and its backward, ``nextafter`` and ``_assert_async`` (``torch._assert``
and the checks libraries make on the device) have no kernel at all. Each kernel computes what
the CPU kernel computes:

============== ====================================================================================
clamp.Tensor   ``minimum(maximum(x, min), max)`` (NaN in any of them is NaN, as on the CPU),
               ``clamp_min``/``clamp_max`` with a tensor bound are ``maximum``/``minimum``
glu            ``a * sigmoid(b)`` of the halves along ``dim``; its backward
               ``[g * s, (1 - s) * s * a * g]`` with ``s = sigmoid(b)``
nextafter      the neighbouring float towards ``other``: the bits as an integer, plus or minus one
               (the smallest subnormal from zero, ``other`` where they are equal, NaN from NaN)
_assert_async  raises the CPU's error when the single value is zero (one read of the value, as
               the fallback's copy would make)
============== ====================================================================================

``clamp`` with tensor bounds and ``glu`` are one to three kernels against the fallback's
read-back per tensor and its copies: always cheaper. ``glu``'s backward (8 kernels) and
``nextafter`` (20) read and write memory many times over, so where memory is little faster
than the bus (an integrated GPU) a large call is cheaper through the CPU: the cost model
chooses per call (:data:`COSTS`). ``_assert_async`` reads its one value back either way.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, functional, in_place, into
from dmlpatch.opfix.cost_terms import TRANSCENDENTAL, elementwise, fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def _clamp_tensor_out(
    self: torch.Tensor,
    min: Optional[torch.Tensor] = None,
    max: Optional[torch.Tensor] = None,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    record("fixed", "aten::clamp.Tensor_out")
    result = self
    if min is not None:
        result = torch.maximum(result, min)
    if max is not None:
        result = torch.minimum(result, max)
    return into(out, result.to(out.dtype))


def _clamp_min_tensor_out(
    self: torch.Tensor, min: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    record("fixed", "aten::clamp_min.Tensor_out")
    return into(out, torch.maximum(self, min).to(out.dtype))


def _clamp_max_tensor_out(
    self: torch.Tensor, max: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    record("fixed", "aten::clamp_max.Tensor_out")
    return into(out, torch.minimum(self, max).to(out.dtype))


def _promoted(self: torch.Tensor, *bounds: Optional[torch.Tensor]) -> torch.Tensor:
    """An empty tensor of the dtype ``self`` and the bounds promote to."""
    dtype = self.dtype
    for bound in bounds:
        if bound is not None:
            dtype = torch.promote_types(dtype, torch.result_type(self, bound))
    return self.new_empty(0, dtype=dtype)


def _clamp_tensor(
    self: torch.Tensor, min: Optional[torch.Tensor] = None, max: Optional[torch.Tensor] = None
) -> torch.Tensor:
    return _clamp_tensor_out(self, min, max, out=_promoted(self, min, max))


def _clamp_min_tensor(self: torch.Tensor, min: torch.Tensor) -> torch.Tensor:
    return _clamp_min_tensor_out(self, min, out=_promoted(self, min))


def _clamp_max_tensor(self: torch.Tensor, max: torch.Tensor) -> torch.Tensor:
    return _clamp_max_tensor_out(self, max, out=_promoted(self, max))


def _halves(self: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if self.dim() == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    dim = dim % self.dim()
    size = self.shape[dim]
    if size % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim} is size {size}")
    first, second = self.split(size // 2, dim)
    return first, second


def _glu_out(self: torch.Tensor, dim: int = -1, *, out: torch.Tensor) -> torch.Tensor:
    first, second = _halves(self, dim)
    record("fixed", "aten::glu.out")
    return into(out, first * torch.sigmoid(second))


def glu_backward_cost(
    grad_output: torch.Tensor, self: torch.Tensor, dim: int, *, grad_input: torch.Tensor
) -> Costs:
    """The gate's sigmoid, both halves' gradients (6 kernels), their ``cat`` and the copy into
    ``grad_input``: 48 bytes an element of the input."""
    n, size = self.numel(), self.element_size()
    host = n / 2 * (TRANSCENDENTAL + 5.0)
    return Costs(
        elementwise(8, n, 48, size), fallback(grad_output, self, up=n * size, host_flops=host)
    )


def nextafter_cost(self: torch.Tensor, other: torch.Tensor, *, out: torch.Tensor) -> Costs:
    """The bits stepped either way, the zero, equal and NaN cases (19 kernels) and the copy
    into ``out``; a cast of each operand of another dtype and a copy of one broadcast."""
    dtype = torch.result_type(self, other)
    shape = torch.broadcast_shapes(self.shape, other.shape)
    n = math.prod(shape)
    extra = (self.dtype != dtype) + (other.dtype != dtype)
    extra += 1 if self.numel() != n or not self.is_contiguous() else 0
    size = torch.empty((), dtype=dtype).element_size()
    device = elementwise(20 + extra, n, 142 + 8 * extra, size)
    return Costs(device, fallback(self, other, up=n * size, host_flops=6.0 * n))


COSTS: dict[str, CostFunction] = {
    "aten::glu_backward": glu_backward_cost,
    "aten::nextafter": nextafter_cost,
}
_GLU_BACKWARD = Chooser("aten::glu_backward")
_NEXTAFTER = Chooser("aten::nextafter")
reset = resetting(_GLU_BACKWARD, _NEXTAFTER)


def _glu_backward_out(
    grad_output: torch.Tensor, self: torch.Tensor, dim: int, *, grad_input: torch.Tensor
) -> torch.Tensor:
    first, second = _halves(self, dim)
    key = (*shapes(grad_output, self), dim)
    if not _GLU_BACKWARD.on_device(
        key, lambda: glu_backward_cost(grad_output, self, dim, grad_input=grad_input)
    ):
        operator = torch.ops.aten.glu_backward.grad_input
        arguments = (grad_output, self, dim)
        name = "aten::glu_backward.grad_input"
        return through_the_cpu(name, operator, arguments, grad_input=grad_input)
    record("fixed", "aten::glu_backward.grad_input")
    gate = torch.sigmoid(second)
    grad_first = gate * grad_output
    grad_second = (1 - gate) * gate * first * grad_output
    return into(grad_input, torch.cat([grad_first, grad_second], dim))


def _glu_backward(grad_output: torch.Tensor, self: torch.Tensor, dim: int) -> torch.Tensor:
    return _glu_backward_out(grad_output, self, dim, grad_input=self.new_empty(0))


#: The integer type of each float type's bits.
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16}


def _nextafter_out(self: torch.Tensor, other: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(self, other)
    if dtype not in _BITS:
        # bfloat16 on a device that holds it as float32, or an integer input: the CPU's error.
        raise RuntimeError(f"\"nextafter_cpu\" not implemented for '{_name(dtype)}'")
    key = (*shapes(self, other), self.is_contiguous())
    if not _NEXTAFTER.on_device(key, lambda: nextafter_cost(self, other, out=out)):
        operator = torch.ops.aten.nextafter.out
        return through_the_cpu("aten::nextafter.out", operator, (self, other), out=out)
    record("fixed", "aten::nextafter.out")
    x, y = torch.broadcast_tensors(self.to(dtype), other.to(dtype))
    bits = x.contiguous().view(_BITS[dtype])
    away_from_zero = (y > x) == (x > 0)
    stepped = torch.where(away_from_zero, bits + 1, bits - 1).view(dtype)
    tiny = torch.ones((), dtype=_BITS[dtype], device=x.device).view(dtype)
    from_zero = torch.where(y > 0, tiny, -tiny)
    result = torch.where(x == 0, from_zero, stepped)
    result = torch.where(x == y, y, result)
    result = torch.where(torch.isnan(x) | torch.isnan(y), x + y, result)
    return into(out, result)


def _nextafter(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return _nextafter_out(self, other, out=_promoted(self, other))


def _name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "BFloat16"}.get(dtype, str(dtype).replace("torch.", ""))


def _assert_async_msg(self: torch.Tensor, assert_msg: str) -> None:
    record("fixed", "aten::_assert_async.msg")
    _check(self, assert_msg or "Assertion is failed")


def _assert_async(self: torch.Tensor) -> None:
    record("fixed", "aten::_assert_async")
    _check(self, "Expected Tensor with single nonzero value, but got zero")


def _check(self: torch.Tensor, message: str) -> None:
    if self.numel() == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if self.numel() > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    if not bool(self.reshape(()).item()):
        raise RuntimeError(message)


KERNELS = (
    Kernel("clamp.Tensor_out", _clamp_tensor_out, "fallback"),
    Kernel("clamp.Tensor", _clamp_tensor, "fallback"),
    Kernel("clamp_.Tensor", in_place(_clamp_tensor_out), "fallback"),
    Kernel("clamp_min.Tensor_out", _clamp_min_tensor_out, "fallback"),
    Kernel("clamp_min.Tensor", _clamp_min_tensor, "fallback"),
    Kernel("clamp_min_.Tensor", in_place(_clamp_min_tensor_out), "fallback"),
    Kernel("clamp_max.Tensor_out", _clamp_max_tensor_out, "fallback"),
    Kernel("clamp_max.Tensor", _clamp_max_tensor, "fallback"),
    Kernel("clamp_max_.Tensor", in_place(_clamp_max_tensor_out), "fallback"),
    Kernel("glu.out", _glu_out, "fallback"),
    Kernel("glu", functional(_glu_out), "fallback"),
    Kernel("glu_backward.grad_input", _glu_backward_out, "fallback"),
    Kernel("glu_backward", _glu_backward, "fallback"),
    Kernel("nextafter.out", _nextafter_out, "fallback"),
    Kernel("nextafter", _nextafter, "fallback"),
    Kernel("nextafter_", in_place(_nextafter_out), "fallback"),
    Kernel("_assert_async.msg", _assert_async_msg, "fallback"),
    Kernel("_assert_async", _assert_async, "fallback"),
)
