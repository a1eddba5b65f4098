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
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel, into

#: ``at::Reduction``: none, mean, sum.
_NONE, _MEAN, _SUM = 0, 1, 2
#: The smallest denominator the CPU's BCE backward divides by.
_BCE_EPSILON = 1e-12


def _logit(self: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
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
    return into(out, _logit(self, eps))


def _logit_(self: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
    return into(self, _logit(self, eps))


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
    return _logit_gradient(grad_output, self, eps)


def _logit_backward_out(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    eps: Optional[float] = None,
    *,
    grad_input: torch.Tensor,
) -> torch.Tensor:
    return into(grad_input, _logit_gradient(grad_output, self, eps))


def _reduce(loss: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == _MEAN:
        return loss.mean()
    if reduction == _SUM:
        return loss.sum()
    return loss


def _bce(
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
    return into(out, _bce(self, target, weight, reduction))


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


def _bce_backward(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = _MEAN,
) -> torch.Tensor:
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
