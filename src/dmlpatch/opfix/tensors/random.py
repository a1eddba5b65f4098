"""``normal_`` from ``uniform_`` and the Box-Muller transform, for pytorch-directml 1.8.

pytorch-directml 1.8 (2022) has no ``normal_`` ("Could not run 'aten::normal_' with arguments
from the 'DML' backend."); GFPGAN/StyleGAN2 decoders call ``new_empty(...).normal_()`` for noise
on every forward pass, and ``torch.randn`` on the device goes through it too.

The transform follows the CPU kernel's layout (``normal_fill``): ``n`` uniforms, transformed in
blocks of 16 where the first 8 give the radius and the last 8 the angle; when ``n`` is not a
multiple of 16, the last 16 outputs come from 16 fresh uniforms. DirectML draws from the CPU
generator, so a contiguous tensor of 16 or more elements gets, seed for seed, the CPU's values
up to the rounding of log/sin/cos. Operators used: ``uniform_``, ``rsub``, ``log``, ``sqrt``,
``mul``, ``add``, ``cos``, ``sin``, ``cat``, ``copy_``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import TRANSCENDENTAL, elementwise, fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu

_BLOCK = 16
_HALF = _BLOCK // 2


def _box_muller(uniforms: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """Blocks of 16 uniforms (shape ``(k, 2, 8)``) to 16 normals each, flattened."""
    radius = torch.sqrt(torch.log(1 - uniforms[:, 0]) * -2)
    theta = uniforms[:, 1] * (2.0 * math.pi)
    normals = torch.stack([radius * torch.cos(theta), radius * torch.sin(theta)], dim=1)
    return (normals * std + mean).reshape(-1)


def normal_values(
    count: int, like: torch.Tensor, mean: float, std: float, generator: Optional[torch.Generator]
) -> torch.Tensor:
    """``count`` normal samples on ``like``'s device and dtype."""
    options = {"dtype": like.dtype, "device": like.device}
    blocks = count // _BLOCK
    parts = []
    if blocks:
        # All `count` uniforms are drawn, as on the CPU, though the last partial block's are
        # then replaced: the generator advances exactly as the CPU kernel advances it.
        uniforms = torch.empty(count, **options).uniform_(0, 1, generator=generator)
        head = uniforms[: blocks * _BLOCK].reshape(blocks, 2, _HALF)
        parts.append(_box_muller(head, mean, std))
    if count % _BLOCK:
        tail = torch.empty(_BLOCK, **options).uniform_(0, 1, generator=generator)
        last = _box_muller(tail.reshape(1, 2, _HALF), mean, std)
        # The last 16 outputs come from the fresh uniforms, as on the CPU.
        parts = [parts[0][: count - _BLOCK], last] if blocks else [last[:count]]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _normal_(
    self: torch.Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    *,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    record("fixed", "aten::normal_")
    if self.numel() == 0:
        return self
    values = normal_values(self.numel(), self, mean, std, generator)
    self.copy_(values.reshape(self.shape))
    return self


# torch.normal with tensor arguments: torch-directml 0.2.5 registers normal_ but not these, so
# they run on the CPU (microsoft/DirectML#405). Each is the CPU kernel's own recipe, normal_
# then a multiply-add, so with the same generator state the values are the CPU's. A tensor std
# is checked for negative values (a read-back): against the fallback's one read-back of std
# alone, a small draw is cheaper through the CPU, and the cost model chooses per call
# (normal.float_Tensor). With a tensor mean the fallback reads back one more: always composed.


def normal_float_tensor_cost(
    mean: float, std: torch.Tensor, *, generator: Optional[torch.Generator] = None
) -> Costs:
    """The check of ``std`` (2 kernels, a read-back), the draw and its multiply-add (3): 22
    bytes an element. The fallback: ``std`` down, the draw up, Box-Muller on the host."""
    n, size = std.numel(), std.element_size()
    device = elementwise(5, n, 22, size)._replace(readbacks=1 if n else 0)
    host = n * (2 * TRANSCENDENTAL + 6.0)
    return Costs(device, fallback(std, up=n * size, host_flops=host))


_NORMAL_FLOAT_TENSOR = Chooser("aten::normal")
reset = resetting(_NORMAL_FLOAT_TENSOR)
COSTS: dict[str, CostFunction] = {"aten::normal": normal_float_tensor_cost}


def _check_std(std: torch.Tensor) -> None:
    if std.numel() and bool((std < 0).any()):
        raise RuntimeError("normal expects all elements of std >= 0.0")


def _normal_tensor_float(
    mean: torch.Tensor, std: float = 1.0, *, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    record("fixed", "aten::normal.Tensor_float")
    out = torch.empty_like(mean, memory_format=torch.contiguous_format)
    return out.normal_(0, std, generator=generator).add_(mean)


def _normal_float_tensor(
    mean: float, std: torch.Tensor, *, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    if not _NORMAL_FLOAT_TENSOR.on_device(
        shapes(std), lambda: normal_float_tensor_cost(mean, std, generator=generator)
    ):
        operator = torch.ops.aten.normal.float_Tensor
        name = "aten::normal.float_Tensor"
        return through_the_cpu(name, operator, (mean, std), generator=generator)
    _check_std(std)
    record("fixed", "aten::normal.float_Tensor")
    out = torch.empty_like(std, memory_format=torch.contiguous_format)
    return out.normal_(0, 1, generator=generator).mul_(std).add_(mean)


def _normal_tensor_tensor(
    mean: torch.Tensor, std: torch.Tensor, *, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    _check_std(std)
    record("fixed", "aten::normal.Tensor_Tensor")
    shape = torch.broadcast_shapes(mean.shape, std.shape)
    out = torch.empty(shape, dtype=mean.dtype, device=mean.device)
    return out.normal_(0, 1, generator=generator).mul_(std).add_(mean)


KERNELS = (
    Kernel("normal_", _normal_, "refused"),
    Kernel("normal.Tensor_float", _normal_tensor_float, "fallback"),
    Kernel("normal.float_Tensor", _normal_float_tensor, "fallback"),
    Kernel("normal.Tensor_Tensor", _normal_tensor_tensor, "fallback"),
)
