"""``torch.optim.Adam/AdamW(fused=True)`` steps, composed of per-tensor operators.

torch offers the fused path for the PrivateUse1 backend, and transformers' Trainer picks it by
default (``optim='adamw_torch_fused'``): each step calls ``_fused_adamw_`` with every parameter.
torch-directml registers no fused optimizer, so every step copies every parameter, gradient and
moment through the CPU fallback (615 copies for a two-layer BERT's three steps). These kernels
do the fused step on the device with the CPU kernel's arithmetic (``FusedAdamKernel.cpp``): the
step count is already incremented by the caller, a ``found_inf`` set by GradScaler skips the
step, and ``grad_scale`` unscales the gradient first.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel


def _fused_step(name: str, decoupled: bool) -> Any:
    qualified = "aten::" + name

    def step(
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        max_exp_avg_sqs: list[torch.Tensor],
        state_steps: list[torch.Tensor],
        *,
        lr: Any,
        beta1: float,
        beta2: float,
        weight_decay: float,
        eps: float,
        amsgrad: bool,
        maximize: bool,
        grad_scale: Optional[torch.Tensor] = None,
        found_inf: Optional[torch.Tensor] = None,
    ) -> None:
        record("fixed", qualified)
        if found_inf is not None and bool(found_inf.item()):
            return
        rate = float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)
        for index, param in enumerate(params):
            grad = grads[index]
            if grad_scale is not None:
                grad = grad / grad_scale
            if maximize:
                grad = -grad
            if weight_decay != 0:
                if decoupled:
                    param.mul_(1 - rate * weight_decay)
                else:
                    grad = grad + param * weight_decay
            exp_avg, exp_avg_sq = exp_avgs[index], exp_avg_sqs[index]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_count = float(state_steps[index].item())
            step_size = rate / (1 - beta1**step_count)
            correction = math.sqrt(1 - beta2**step_count)
            second = exp_avg_sq
            if amsgrad:
                torch.maximum(max_exp_avg_sqs[index], exp_avg_sq, out=max_exp_avg_sqs[index])
                second = max_exp_avg_sqs[index]
            denominator = (second.sqrt() / correction).add_(eps)
            param.addcdiv_(exp_avg, denominator, value=-step_size)

    return step


KERNELS = (
    Kernel("_fused_adam_", _fused_step("_fused_adam_", decoupled=False), "fallback"),
    Kernel("_fused_adam_.tensor_lr", _fused_step("_fused_adam_.tensor_lr", False), "fallback"),
    Kernel("_fused_adamw_", _fused_step("_fused_adamw_", decoupled=True), "fallback"),
    Kernel("_fused_adamw_.tensor_lr", _fused_step("_fused_adamw_.tensor_lr", True), "fallback"),
)
