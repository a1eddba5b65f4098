"""Weight normalisation, which torch-directml 0.2.5 runs on the CPU, on the device.

``nn.utils.weight_norm`` and ``parametrizations.weight_norm`` recompute ``w = g * v / ||v||``
before every forward of the module: wav2vec2's positional convolution, every convolution of
HiFi-GAN-style vocoders (and the many TTS and voice-conversion models built on them). PyTorch
calls its fused ``_weight_norm_interface`` for ``dim`` 0 or the last dimension, and its fused
backward when training; DirectML has neither, so each forward copies the weight to the host and
back. The kernels here are the CPU kernels' arithmetic (``WeightNormKernel.cpp``):

- ``norms``: the 2-norm of ``v`` over every dimension but ``dim``, shaped like ``g``, computed
  in float32 for float16 and bfloat16 weights and kept so;
- ``w = v * (g / norms)``;
- backward: ``grad_g = sum(grad_w * v) / norms`` and
  ``grad_v = (g / norms) * (grad_w - v * (sum(grad_w * v) / norms**2))``, sums over the same
  dimensions.

Five kernels forward and nine backward, no read-back, against the fallback's read-back per
tensor (two, four) and its copies of the weight; the backward moves 40 bytes an element, so
where memory is little faster than the bus (an integrated GPU) a large weight's is about as
cheap through the CPU: the cost model chooses per call (:data:`COSTS`).
"""

from __future__ import annotations

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import elementwise, fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def _sum_except(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The sum over every dimension but ``dim``, kept as size 1 (none for a vector: an empty
    list of dimensions would sum them all)."""
    reduced = [d for d in range(x.dim()) if d != dim]
    return x.sum(reduced, keepdim=True) if reduced else x


def _accumulated(v: torch.Tensor) -> torch.Tensor:
    return v.float() if v.dtype in (torch.float16, torch.bfloat16) else v


def _half(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float16, torch.bfloat16)


def forward_cost(v: torch.Tensor, g: torch.Tensor, dim: int = 0) -> Costs:
    """The squares, their sum, its root, ``g`` over it and the product (5 kernels, 20 bytes
    an element of ``v``), and the casts of half-precision weights (3). The fallback: ``v`` and
    ``g`` down, ``w`` and the norms up, 3 operations an element."""
    n = v.numel()
    casts = 3 if _half(v) else 0
    device = elementwise(5 + casts, n, 20 + 8 * casts)
    up = n * v.element_size() + 4 * g.numel()
    return Costs(device, fallback(v, g, up=up, host_flops=3.0 * n))


def backward_cost(
    grad_w: torch.Tensor,
    saved_v: torch.Tensor,
    saved_g: torch.Tensor,
    saved_norms: torch.Tensor,
    dim: int,
) -> Costs:
    """The dot product with ``v`` and both gradients' arithmetic (9 kernels, 40 bytes an
    element), and the casts of half-precision weights (5). The fallback: the four tensors
    down, both gradients up, 6 operations an element."""
    n = saved_v.numel()
    casts = 5 if _half(saved_v) else 0
    device = elementwise(9 + casts, n, 40 + 8 * casts)
    up = n * saved_v.element_size() + saved_g.numel() * saved_g.element_size()
    moved = fallback(grad_w, saved_v, saved_g, saved_norms, up=up, host_flops=6.0 * n)
    return Costs(device, moved)


COSTS: dict[str, CostFunction] = {
    "aten::_weight_norm_interface": forward_cost,
    "aten::_weight_norm_interface_backward": backward_cost,
}
_FORWARD = Chooser("aten::_weight_norm_interface")
_BACKWARD = Chooser("aten::_weight_norm_interface_backward")
reset = resetting(_FORWARD, _BACKWARD)


def _weight_norm_interface(
    v: torch.Tensor, g: torch.Tensor, dim: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    dim = dim % v.dim()
    if dim not in (0, v.dim() - 1):
        raise RuntimeError("fused kernels can only be applied for first or last dim")
    if not _FORWARD.on_device((*shapes(v, g), dim), lambda: forward_cost(v, g, dim)):
        operator = torch.ops.aten._weight_norm_interface
        return through_the_cpu("aten::_weight_norm_interface", operator, (v, g, dim))
    record("fixed", "aten::_weight_norm_interface")
    wide, wide_g = _accumulated(v), _accumulated(g)
    norms = _sum_except(wide * wide, dim).sqrt()
    w = (wide * (wide_g / norms)).to(v.dtype)
    # The norms of half-precision weights stay float32, as CUDA (and later torch's CPU) keep them.
    return w, norms.to(wide_g.dtype).reshape(g.shape)


def _weight_norm_interface_backward(
    grad_w: torch.Tensor,
    saved_v: torch.Tensor,
    saved_g: torch.Tensor,
    saved_norms: torch.Tensor,
    dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    dim = dim % saved_v.dim()
    if dim not in (0, saved_v.dim() - 1):
        raise RuntimeError("fused kernels can only be applied for first or last dim")
    arguments = (grad_w, saved_v, saved_g, saved_norms, dim)
    key = (*shapes(grad_w, saved_v, saved_g, saved_norms), dim)
    if not _BACKWARD.on_device(key, lambda: backward_cost(*arguments)):
        operator = torch.ops.aten._weight_norm_interface_backward
        return through_the_cpu("aten::_weight_norm_interface_backward", operator, arguments)
    record("fixed", "aten::_weight_norm_interface_backward")
    v, grad = _accumulated(saved_v), _accumulated(grad_w)
    keep = [saved_v.shape[d] if d == dim else 1 for d in range(saved_v.dim())]
    norms = _accumulated(saved_norms).reshape(keep)
    g = _accumulated(saved_g).reshape(keep)
    dot = _sum_except(grad * v, dim)
    grad_g = dot / norms
    grad_v = (g / norms) * (grad - v * (dot / (norms * norms)))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype).reshape(saved_g.shape)


KERNELS = (
    Kernel("_weight_norm_interface", _weight_norm_interface, "fallback"),
    Kernel("_weight_norm_interface_backward", _weight_norm_interface_backward, "fallback"),
)
