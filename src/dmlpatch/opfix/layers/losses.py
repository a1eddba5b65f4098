"""``logit`` and ``binary_cross_entropy`` (forward and backward), which torch-directml 0.2.5
runs on the CPU, on the device.

RT-DETR's decoder calls ``logit`` (inverse sigmoid) on its reference points every step;
``nn.BCELoss`` is the classic GAN and multi-label loss (microsoft/DirectML#411). Each kernel is
the CPU kernel's formula:

========================= ==================================================================
logit                     ``log(z / (1 - z))``, ``z = clamp(x, eps, 1 - eps)`` when eps is given
logit_backward            ``dy / (x (1 - x))``; outside ``[eps, 1 - eps]`` 0 (NaN outside [0, 1]
                          without eps)
binary_cross_entropy      ``(t - 1)·max(log1p(-x), -100) - t·max(log(x), -100)``, weighted,
                          then reduced
binary_cross_entropy_     ``dy·(x - t) / max((1 - x)·x, 1e-12)``, weighted, ``/ numel`` for mean
backward
========================= ==================================================================

``nll_loss_backward`` (the backward of ``F.cross_entropy`` and ``F.nll_loss``) is a wrong answer,
not a fallback: with ``reduction='none'`` DirectML's kernel gives an all-zero gradient
(microsoft/DirectML#739, #740), so a language model trained on a weighted per-token loss never
learns. The fix writes ``-dy·w[t]`` at each row's target (nothing for ``ignore_index``) with one
scatter; the other reductions go to DirectML's own kernel.

``logit`` and BCE, forward and backward, are 3 to 14 kernels (BCE's check of its input reads
one value back) against the fallback's read-back per tensor and its copies; they read and
write memory several times over (BCE: 94 bytes an element), so where memory is little faster
than the bus (an integrated GPU) a large call is cheaper through the CPU: the cost model
chooses per call (:data:`COSTS`).
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into
from dmlpatch.opfix.cost_terms import TRANSCENDENTAL, elementwise, fallback, resetting, shapes
from dmlpatch.opfix.on_the_cpu import through_the_cpu

#: ``at::Reduction``: none, mean, sum.
_NONE, _MEAN, _SUM = 0, 1, 2
#: The smallest denominator the CPU's BCE backward divides by.
_BCE_EPSILON = 1e-12


# ---- what they cost: kernels and bytes an element counted from the code (float32) ----


def logit_cost(
    self: torch.Tensor, eps: Optional[float] = None, out: Optional[torch.Tensor] = None
) -> Costs:
    """``log(z / (1 - z))`` (3 kernels), the clamp to ``eps`` (1, or 6 when its bounds cross),
    a cast of an integer input, the copy into ``out``."""
    n = self.numel()
    clamp = 0 if eps is None else (1 if eps <= 0.5 else 6)
    extra = clamp + (0 if self.is_floating_point() else 1) + (0 if out is None else 1)
    device = elementwise(3 + extra, n, 28 + 8 * extra)
    up = n * (out if out is not None else self).element_size()
    return Costs(device, fallback(self, up=up, host_flops=n * (TRANSCENDENTAL + 2.0)))


def logit_backward_cost(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    eps: Optional[float] = None,
    grad_input: Optional[torch.Tensor] = None,
) -> Costs:
    """``dy / (x (1 - x))`` (3 kernels), the mask of the outside and its fill (5), the copy
    into ``grad_input``."""
    n, size = self.numel(), self.element_size()
    copy = 0 if grad_input is None else 1
    device = elementwise(8 + copy, n, 54 + 8 * copy, size)
    return Costs(device, fallback(grad_output, self, up=n * size, host_flops=4.0 * n))


def bce_cost(
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
    out: Optional[torch.Tensor] = None,
) -> Costs:
    """The check that every input is a probability (4 kernels, a read-back), both clamped
    logs (5), the loss (4), the weight, the reduction, the copy into ``out``."""
    n, size = self.numel(), self.element_size()
    extra = (weight is not None) + (reduction != _NONE) + (out is not None)
    device = elementwise(13 + extra, n, 90 + 4 * extra, size)._replace(readbacks=1 if n else 0)
    up = size * (n if reduction == _NONE else 1)
    host = n * (2 * TRANSCENDENTAL + 6.0)
    return Costs(device, fallback(self, target, weight, up=up, host_flops=host))


def bce_backward_cost(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
    grad_input: Optional[torch.Tensor] = None,
) -> Costs:
    """``dy (x - t) / max((1 - x) x, eps)`` (6 kernels), the weight, the mean, the copy into
    ``grad_input``."""
    n, size = self.numel(), self.element_size()
    extra = (weight is not None) + (reduction == _MEAN) + (grad_input is not None)
    device = elementwise(6 + extra, n, 68 + 4 * extra, size)
    moved = fallback(grad_output, self, target, weight, up=n * size, host_flops=6.0 * n)
    return Costs(device, moved)


COSTS: dict[str, CostFunction] = {
    "aten::logit": logit_cost,
    "aten::logit_backward": logit_backward_cost,
    "aten::binary_cross_entropy": bce_cost,
    "aten::binary_cross_entropy_backward": bce_backward_cost,
}
_LOGIT = Chooser("aten::logit")
_LOGIT_BACKWARD = Chooser("aten::logit_backward")
_BCE = Chooser("aten::binary_cross_entropy")
_BCE_BACKWARD = Chooser("aten::binary_cross_entropy_backward")
reset = resetting(_LOGIT, _LOGIT_BACKWARD, _BCE, _BCE_BACKWARD)


def _logit_on_device(
    self: torch.Tensor, eps: Optional[float], out: Optional[torch.Tensor] = None
) -> bool:
    key = (*shapes(self, out), eps is None or eps <= 0.5)
    return _LOGIT.on_device(key, lambda: logit_cost(self, eps, out))


def _logit(self: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
    if not _logit_on_device(self, eps):
        return through_the_cpu("aten::logit", torch.ops.aten.logit, (self, eps))
    return _composed_logit(self, eps)


def _composed_logit(self: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
    record("fixed", "aten::logit")
    if not self.is_floating_point():  # integers and bools, as the CPU: in the default dtype
        self = self.to(torch.get_default_dtype())
    if eps is None:
        z = self
    elif eps <= 0.5:
        z = self.clamp(eps, 1 - eps)
    else:  # bounds crossed: the CPU kernel tests the lower first, where clamp keeps the upper
        z = torch.where(self < eps, eps, torch.where(self > 1 - eps, 1 - eps, self))
    return torch.log(z / (1 - z))


def _logit_out(
    self: torch.Tensor, eps: Optional[float] = None, *, out: torch.Tensor
) -> torch.Tensor:
    if not _logit_on_device(self, eps, out):
        return through_the_cpu("aten::logit.out", torch.ops.aten.logit.out, (self, eps), out=out)
    return into(out, _composed_logit(self, eps))


def _logit_(self: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
    return _logit_out(self, eps, out=self)


def _logit_backward_on_device(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    eps: Optional[float],
    grad_input: Optional[torch.Tensor] = None,
) -> bool:
    key = (*shapes(grad_output, self, grad_input), eps is None)
    return _LOGIT_BACKWARD.on_device(
        key, lambda: logit_backward_cost(grad_output, self, eps, grad_input)
    )


def _logit_gradient(
    grad_output: torch.Tensor, self: torch.Tensor, eps: Optional[float]
) -> torch.Tensor:
    record("fixed", "aten::logit_backward.grad_input")
    gradient = grad_output / (self * (1 - self))
    if eps is None:
        outside = (self < 0) | (self > 1)
        return gradient.masked_fill(outside, float("nan"))
    outside = (self < eps) | (self > 1 - eps)
    return gradient.masked_fill(outside, 0.0)


def _logit_backward(
    grad_output: torch.Tensor, self: torch.Tensor, eps: Optional[float] = None
) -> torch.Tensor:
    if not _logit_backward_on_device(grad_output, self, eps):
        operator = torch.ops.aten.logit_backward
        return through_the_cpu("aten::logit_backward", operator, (grad_output, self, eps))
    return _logit_gradient(grad_output, self, eps)


def _logit_backward_out(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    eps: Optional[float] = None,
    *,
    grad_input: torch.Tensor,
) -> torch.Tensor:
    if not _logit_backward_on_device(grad_output, self, eps, grad_input):
        operator = torch.ops.aten.logit_backward.grad_input
        name = "aten::logit_backward.grad_input"
        return through_the_cpu(name, operator, (grad_output, self, eps), grad_input=grad_input)
    return into(grad_input, _logit_gradient(grad_output, self, eps))


def _reduce(loss: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == _MEAN:
        return loss.mean()
    if reduction == _SUM:
        return loss.sum()
    return loss


def _bce_on_device(
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    reduction: int,
    out: Optional[torch.Tensor] = None,
) -> bool:
    key = (*shapes(self, target, weight, out), reduction)
    return _BCE.on_device(key, lambda: bce_cost(self, target, weight, reduction, out))


def _bce(
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
) -> torch.Tensor:
    if not _bce_on_device(self, target, weight, reduction):
        operator = torch.ops.aten.binary_cross_entropy
        arguments = (self, target, weight, reduction)
        return through_the_cpu("aten::binary_cross_entropy", operator, arguments)
    return _composed_bce(self, target, weight, reduction)


def _composed_bce(
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
) -> torch.Tensor:
    record("fixed", "aten::binary_cross_entropy")
    if self.numel() and bool(((self < 0) | (self > 1)).any()):
        raise RuntimeError("all elements of input should be between 0 and 1")
    log_x = torch.clamp_min(torch.log(self), -100)
    log_1mx = torch.clamp_min(torch.log1p(-self), -100)
    loss = (target - 1) * log_1mx - target * log_x
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def _bce_out(
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    if not _bce_on_device(self, target, weight, reduction, out):
        operator = torch.ops.aten.binary_cross_entropy.out
        arguments = (self, target, weight, reduction)
        return through_the_cpu("aten::binary_cross_entropy.out", operator, arguments, out=out)
    return into(out, _composed_bce(self, target, weight, reduction))


def _bce_gradient(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    reduction: int,
) -> torch.Tensor:
    record("fixed", "aten::binary_cross_entropy_backward")
    gradient = grad_output * (self - target) / torch.clamp_min((1 - self) * self, _BCE_EPSILON)
    if weight is not None:
        gradient = gradient * weight
    if reduction == _MEAN:
        gradient = gradient / self.numel()
    return gradient


def _bce_backward_on_device(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    reduction: int,
    grad_input: Optional[torch.Tensor] = None,
) -> bool:
    key = (*shapes(grad_output, self, target, weight, grad_input), reduction)
    return _BCE_BACKWARD.on_device(
        key, lambda: bce_backward_cost(grad_output, self, target, weight, reduction, grad_input)
    )


def _bce_backward(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
) -> torch.Tensor:
    if not _bce_backward_on_device(grad_output, self, target, weight, reduction):
        operator = torch.ops.aten.binary_cross_entropy_backward
        arguments = (grad_output, self, target, weight, reduction)
        return through_the_cpu("aten::binary_cross_entropy_backward", operator, arguments)
    return _bce_gradient(grad_output, self, target, weight, reduction)


def _bce_backward_out(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
    *,
    grad_input: torch.Tensor,
) -> torch.Tensor:
    if not _bce_backward_on_device(grad_output, self, target, weight, reduction, grad_input):
        operator = torch.ops.aten.binary_cross_entropy_backward.grad_input
        arguments = (grad_output, self, target, weight, reduction)
        name = "aten::binary_cross_entropy_backward.grad_input"
        return through_the_cpu(name, operator, arguments, grad_input=grad_input)
    return into(grad_input, _bce_gradient(grad_output, self, target, weight, reduction))


def _nll_loss_backward(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    reduction: int,
    ignore_index: int,
    total_weight: torch.Tensor,
) -> torch.Tensor:
    if reduction != _NONE:
        return torch.ops.aten.nll_loss_backward.grad_input(
            grad_output,
            self,
            target,
            weight,
            reduction,
            ignore_index,
            total_weight,
            grad_input=torch.empty_like(self),
        )
    record("fixed", "aten::nll_loss_backward.grad_input")
    rows = self if self.dim() == 2 else self.unsqueeze(0)
    targets = target.reshape(-1)
    kept = targets != ignore_index
    index = targets.masked_fill(~kept, 0)
    gradient = -grad_output.reshape(-1).to(self.dtype)
    if weight is not None:
        gradient = gradient * weight.index_select(0, index)
    gradient = gradient.masked_fill(~kept, 0)
    grad_input = torch.zeros_like(rows)
    grad_input.scatter_(1, index.unsqueeze(1), gradient.unsqueeze(1))
    return grad_input if self.dim() == 2 else grad_input.squeeze(0)


KERNELS = (
    Kernel("logit", _logit, "fallback"),
    Kernel("logit.out", _logit_out, "fallback"),
    Kernel("logit_", _logit_, "fallback"),
    Kernel("logit_backward", _logit_backward, "fallback"),
    Kernel("logit_backward.grad_input", _logit_backward_out, "fallback"),
    Kernel("binary_cross_entropy", _bce, "fallback"),
    Kernel("binary_cross_entropy.out", _bce_out, "fallback"),
    Kernel("binary_cross_entropy_backward", _bce_backward, "fallback"),
    Kernel("binary_cross_entropy_backward.grad_input", _bce_backward_out, "fallback"),
    Kernel("nll_loss_backward", _nll_loss_backward, "quirk", quirk="cross-entropy-none-grad"),
)
