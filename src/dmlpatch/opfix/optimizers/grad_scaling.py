"""GradScaler's two operators on the device: the unscale-and-check of every gradient, and the
update of the scale.

``torch.amp.GradScaler`` unscales the gradients of each optimizer with
``_amp_foreach_non_finite_check_and_unscale_`` (once per device and dtype) and updates its
scale with ``_amp_update_scale_``. torch-directml registers neither, so each step of a
mixed-precision loop copies every gradient through its CPU fallback, a read-back each, and back
again. These kernels do both on the device with the CPU kernel's arithmetic
(``AmpGradScalerKernels.cpp``, which follows CUDA's), and read nothing back:

- **the check** is one kernel per gradient: ``mse_loss(g, g, reduction='sum')``, which DirectML
  runs natively. It is 0 for a finite gradient and NaN where any element is infinite or NaN
  (``inf - inf`` is NaN, and NaN survives squaring and summing), so no finite value can make it
  overflow and no NaN can escape it (a maximum would not do: D3D's ``max`` returns the operand
  that is not NaN). The gradients' sums are stacked and summed, and ``found_inf`` is set to 1
  where that is NaN (``masked_fill_``): it is only ever set, never cleared, as CUDA's is. The
  check reads each gradient before it is unscaled, as CUDA's does.
- **the unscale** is one ``mul_`` per gradient by ``inv_scale`` viewed as a one-element vector,
  so that a float16 or bfloat16 gradient is multiplied in float32 and rounded once, as CUDA's
  opmath does (a 0-dim float32 factor would be rounded to float16 first, where ``2**-25`` is 0).

So ``2N + 4`` kernels for ``N`` gradients (``4`` for one), three passes over their bytes,
where the fallback reads each gradient back and copies it both ways. The update is 12 kernels
on one-element tensors (two more for each factor float32 cannot hold exactly, whose product is
taken in float64 as the CPU's is), against the fallback's three read-backs. The cost model
chooses per call all the same (:func:`unscale_cost`, :func:`update_cost`).
"""

from __future__ import annotations

import math
import struct

import torch

from dmlpatch.costs.choice import Chooser, CostFunction, Costs, OnDevice
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.cost_terms import fallback, nbytes, resetting
from dmlpatch.opfix.on_the_cpu import through_the_cpu

_UNSCALE = "aten::_amp_foreach_non_finite_check_and_unscale_"
_UPDATE = "aten::_amp_update_scale_"
#: The dtypes the CPU kernel dispatches on (``AT_DISPATCH_FLOATING_TYPES`` and the reduced
#: floating types).
_FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: ``mse_loss``'s reduction argument for a sum (``at::Reduction::Sum``).
_SUM = 2
_INT32 = (-(2**31), 2**31 - 1)
#: The device the kernels serve, as the CPU kernel's checks name theirs.
_DEVICE = "privateuseone"


def _check_unscale(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """The CPU kernel's checks, in its order and words (the device named for the CPU)."""
    if inv_scale.device.type != _DEVICE:
        raise RuntimeError(f"inv_scale must be a {_DEVICE} tensor.")
    if found_inf.device.type != _DEVICE:
        raise RuntimeError(f"found_inf must be a {_DEVICE} tensor.")
    if inv_scale.numel() != 1:
        raise RuntimeError("inv_scale must be a 1-element tensor.")
    if found_inf.numel() != 1:
        raise RuntimeError("found_inf must be a 1-element tensor.")
    if inv_scale.dtype != torch.float32:
        raise RuntimeError("inv_scale must be a float tensor.")
    if found_inf.dtype != torch.float32:
        raise RuntimeError("found_inf must be a float tensor.")
    for grad in grads:
        if grad.device.type != _DEVICE:
            raise RuntimeError(f"one of scaled_grads was not a {_DEVICE} tensor.")
        if grad.layout != torch.strided:
            raise RuntimeError("one of scaled_grads was not a strided tensor.")
        if grad.dtype not in _FLOATING:
            raise RuntimeError(
                f'"_amp_foreach_non_finite_check_and_unscale_cpu" not implemented for '
                f"'{_c10_name(grad.dtype)}'"
            )


def _c10_name(dtype: torch.dtype) -> str:
    """c10's name of a dtype, as its dispatch errors say it (``Long``, ``Int``)."""
    return torch.empty(0, dtype=dtype).type().split(".")[-1].replace("Tensor", "")


def unscale_cost(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> Costs:
    """The check and unscale of ``grads``: per non-empty gradient ``mse_loss`` (reads it: one
    memory behind both operands) and ``mul_`` (reads and writes it), then the sums stacked and
    summed (where more than one), ``isnan`` and ``masked_fill_``; about four FLOPs an
    element. The fallback: every gradient,
    ``found_inf`` and ``inv_scale`` down, the gradients and ``found_inf`` up, two FLOPs an
    element on the host."""
    present = [grad for grad in grads if grad.numel()]
    elements = sum(grad.numel() for grad in present)
    moved = nbytes(*present)
    launches = 2 * len(present) + (2 if len(present) > 1 else 0) + (2 if present else 0)
    half = bool(present) and all(grad.dtype == torch.float16 for grad in present)
    device = OnDevice(launches, 0, 3.0 * moved, 4.0 * elements, half)
    up = nbytes(*grads, found_inf)
    return Costs(device, fallback(*grads, found_inf, inv_scale, up=up, host_flops=2.0 * elements))


def _float32_exact(factor: float) -> bool:
    """Whether ``factor`` is a float32 value: then the float32 product rounds as the CPU's
    float64 product cast to float32 does (a product of two float32 values is exact in
    float64)."""
    try:
        return bool(struct.unpack("f", struct.pack("f", factor))[0] == factor)
    except OverflowError:
        return False


def _in_int32(interval: int) -> bool:
    return _INT32[0] <= interval <= _INT32[1]


def update_cost(
    current_scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> Costs:
    """The update: 12 kernels on one-element tensors (``ne``, ``add_``, ``eq``, two products,
    ``abs``, ``lt``, ``logical_and_``, two ``where``, ``logical_or``, ``masked_fill_``), two
    more for each factor float32 cannot hold (cast to float64 and back); five where the
    interval is beyond int32, which the tracker never reaches. The fallback: the three tensors
    down (a read-back each), the scale and the tracker up."""
    launches = 12 if _in_int32(growth_interval) else 5
    launches += sum(2 for f in (growth_factor, backoff_factor) if not _float32_exact(f))
    device = OnDevice(launches, 0, 8.0 * launches, float(launches))
    up = nbytes(current_scale, growth_tracker)
    return Costs(device, fallback(current_scale, growth_tracker, found_inf, up=up))


COSTS: dict[str, CostFunction] = {_UNSCALE: unscale_cost, _UPDATE: update_cost}
_UNSCALE_CHOOSER = Chooser(_UNSCALE)
_UPDATE_CHOOSER = Chooser(_UPDATE)
reset = resetting(_UNSCALE_CHOOSER, _UPDATE_CHOOSER)


def _non_finite_check_and_unscale(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    if not grads:
        return  # before any check, as the CPU kernel
    _check_unscale(grads, found_inf, inv_scale)
    # What decides the cost: how many gradients, and their bytes.
    key = (len(grads), nbytes(*grads))
    if not _UNSCALE_CHOOSER.on_device(key, lambda: unscale_cost(grads, found_inf, inv_scale)):
        overload = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
        through_the_cpu(_UNSCALE, overload, (grads, found_inf, inv_scale))
        return
    record("fixed", _UNSCALE)
    present = [grad for grad in grads if grad.numel()]
    if not present:
        return
    sums = [
        torch.ops.aten.mse_loss.out(grad, grad, _SUM, out=grad.new_empty(0)) for grad in present
    ]
    # A 1-d factor takes part in type promotion: a float16 gradient is multiplied in float32.
    factor = inv_scale.reshape(1)
    for grad in present:
        (grad if grad.dim() else grad.view(1)).mul_(factor)
    total = sums[0] if len(sums) == 1 else torch.stack(sums).sum()
    found_inf.masked_fill_(total.isnan(), 1.0)


def _times(scale: torch.Tensor, factor: float) -> torch.Tensor:
    """``scale * factor`` rounded to float32 as the CPU kernel's ``float * double`` is."""
    if _float32_exact(factor):
        return scale * factor
    return (scale.double() * factor).float()


def _check_update(
    current_scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor
) -> None:
    named = (
        ("growth_tracker", growth_tracker),
        ("current_scale", current_scale),
        ("found_inf", found_inf),
    )
    for name, tensor in named:
        if tensor.device.type != _DEVICE:
            raise RuntimeError(f"{name} must be a {_DEVICE} tensor.")
    for name, tensor in named:
        if tensor.numel() != 1:
            raise RuntimeError(f"{name} must be a 1-element tensor.")
    if growth_tracker.dtype != torch.int32:
        raise RuntimeError("growth_tracker must be an int tensor.")
    if current_scale.dtype != torch.float32:
        raise RuntimeError("current_scale must be a float tensor.")
    if found_inf.dtype != torch.float32:
        raise RuntimeError("found_inf must be a float tensor.")


def _update_scale(
    current_scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> torch.Tensor:
    _check_update(current_scale, growth_tracker, found_inf)
    arguments = (
        current_scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval
    )  # fmt: skip
    key = (
        _float32_exact(growth_factor), _float32_exact(backoff_factor), _in_int32(growth_interval)
    )  # fmt: skip
    if not _UPDATE_CHOOSER.on_device(key, lambda: update_cost(*arguments)):
        result: torch.Tensor = through_the_cpu(
            _UPDATE, torch.ops.aten._amp_update_scale_.default, arguments
        )
        return result
    record("fixed", _UPDATE)
    # 0-dim views of the one-element tensors, so that every mask and product has one shape.
    scale = current_scale.view(())
    tracker = growth_tracker.view(())
    # C's `if (*found_inf_ptr)`: NaN is found too.
    found = found_inf.view(()).ne(0)
    backed_off = _times(scale, backoff_factor)  # of the scale before any growth
    tracker.add_(1)  # a successful step, unless found (then reset below)
    reset_tracker = found
    if _in_int32(growth_interval):
        at_interval = tracker.eq(growth_interval)
        grown = _times(scale, growth_factor)
        # Not grown past float32's bounds (nor to NaN): `std::isfinite(new_scale)`.
        grows = grown.abs().lt(math.inf).logical_and_(at_interval)
        torch.where(grows, grown, scale, out=scale)
        reset_tracker = found.logical_or(at_interval)
    torch.where(found, backed_off, scale, out=scale)
    tracker.masked_fill_(reset_tracker, 0)
    return current_scale


KERNELS = (
    Kernel("_amp_foreach_non_finite_check_and_unscale_", _non_finite_check_and_unscale, "fallback"),
    Kernel("_amp_update_scale_", _update_scale, "fallback"),
)
