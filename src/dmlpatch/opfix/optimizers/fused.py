"""``torch.optim.Adam/AdamW(fused=True)`` steps, composed of per-tensor operators.

torch offers the fused path for the PrivateUse1 backend, and transformers' Trainer picks it by
default (``optim='adamw_torch_fused'``): each step calls ``_fused_adamw_`` with every parameter.
torch-directml registers no fused optimizer, so every step copies every parameter, gradient and
moment through the CPU fallback (615 copies for a two-layer BERT's three steps). These kernels
do the fused step on the device with the CPU kernel's arithmetic (``FusedAdamKernel.cpp``): the
step count is already incremented by the caller, a ``found_inf`` set by GradScaler skips the
step, and ``grad_scale`` unscales the gradient first.

The step costs about 11 kernels and one read-back (its step count) per parameter, where the
fallback reads back five tensors per parameter and copies them both ways; the kernels move
about 88 bytes an element, so where memory is little faster than the bus (an integrated GPU)
a model of large parameters can step as cheaply through the CPU: the cost model chooses per
call (:func:`cost`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import fallback, resetting
from dmlpatch.opfix.on_the_cpu import through_the_cpu


def cost(decoupled: bool) -> Any:
    """The cost function of a fused Adam (``decoupled``: AdamW) step: per parameter the moments
    (``lerp_`` composed: 4 kernels; 2 more), the step size read back, the update (4), and one
    or two for weight decay, one each for unscaling, maximising and AMSGrad's maximum; the
    read-backs of ``found_inf`` and a tensor learning rate. The fallback: every tensor of
    every list down, the parameters and moments up, about 8 operations an element (what the
    CPU kernel took on this project's machine)."""

    def step_cost(
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
    ) -> Costs:
        count = len(params)
        elements = sum(p.numel() for p in params)
        decay = 0 if weight_decay == 0 else (1 if decoupled else 2)
        extras = decay + (grad_scale is not None) + maximize + amsgrad
        reads = count + (found_inf is not None) + isinstance(lr, torch.Tensor)
        device = OnDevice(
            count * (10 + extras), reads, elements * (88 + 12 * extras), elements * 15.0
        )
        lists = [*params, *grads, *exp_avgs, *exp_avg_sqs, *max_exp_avg_sqs, *state_steps]
        written = [*params, *exp_avgs, *exp_avg_sqs, *(max_exp_avg_sqs if amsgrad else [])]
        up = sum(t.numel() * t.element_size() for t in written)
        others = (grad_scale, found_inf, lr if isinstance(lr, torch.Tensor) else None)
        return Costs(device, fallback(*lists, *others, up=up, host_flops=8.0 * elements))

    return step_cost


COSTS: dict[str, CostFunction] = {
    "aten::_fused_adam_": cost(decoupled=False),
    "aten::_fused_adamw_": cost(decoupled=True),
}
_ADAM = Chooser("aten::_fused_adam_")
_ADAMW = Chooser("aten::_fused_adamw_")
_CHOOSERS = {chooser.operator: chooser for chooser in (_ADAM, _ADAMW)}
reset = resetting(_ADAM, _ADAMW)


def _fused_step(name: str, decoupled: bool) -> Any:
    qualified = "aten::" + name
    base, _, overload_name = name.partition(".")
    chooser, step_cost = _CHOOSERS["aten::" + base], COSTS["aten::" + base]
    overload = getattr(getattr(torch.ops.aten, base), overload_name or "default")

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
        lists = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
        options = {
            "lr": lr, "beta1": beta1, "beta2": beta2, "weight_decay": weight_decay, "eps": eps,
            "amsgrad": amsgrad, "maximize": maximize, "grad_scale": grad_scale,
            "found_inf": found_inf,
        }  # fmt: skip
        # What decides the cost: the parameters' count, elements and dtype, and the options
        # that add kernels or read-backs.
        key = (
            len(params), sum(p.numel() for p in params), params[0].dtype if params else None,
            weight_decay == 0, amsgrad, maximize, grad_scale is None, found_inf is None,
            isinstance(lr, torch.Tensor),
        )  # fmt: skip
        if not chooser.on_device(key, lambda: step_cost(*lists, **options)):
            through_the_cpu(qualified, overload, lists, **options)
            return
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
