"""Helpers for the op-fix tests."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any, Callable

import torch

from dmlpatch import opfix
from dmlpatch.costs.choice import Chooser
from dmlpatch.opfix import registry

PROFILE = "torch-directml-0.2.5"

#: Integer views for comparing floating-point results bit for bit (NaN payloads, -0.0).
_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


@contextlib.contextmanager
def without_fixes() -> Iterator[None]:
    """The device as DirectML ships it, for the length of the block."""
    opfix.uninstall()
    try:
        yield
    finally:
        opfix.install("sim", PROFILE)


def decide_again() -> None:
    """Every fix's per-call choices forgotten, so that the next call of each operator reads
    ``DMLPATCH_DEVICE_OPS`` and the cost model afresh (and nothing else of the fixes' state
    changes)."""
    for fix in registry.fixes():
        for value in vars(importlib.import_module(fix.module)).values():
            if isinstance(value, Chooser):
                value.reset()


def no_copies(counters: dict[str, Any]) -> bool:
    """No host<->device transfer, CPU fallback or refusal happened."""
    transfers = counters["transfers"]
    return (
        all(transfers[k]["count"] == 0 for k in ("h2d", "d2h", "d2d"))
        and counters["ops"]["fallback"] == {}
        and counters["ops"]["refused"] == {}
        and counters["copies"] == {}
    )


def close(device_result: torch.Tensor, cpu_result: torch.Tensor) -> bool:
    """Same dtype and shape; floats equal within float32 (or the dtype's) rounding: 1e-5 of
    each value, and 32 roundings of the largest, since a sum (grid_sample's grid gradient) is
    rounded at its terms' size, not the result's."""
    got = device_result.cpu()
    if got.dtype != cpu_result.dtype or got.shape != cpu_result.shape:
        return False
    if got.is_floating_point():
        finite = cpu_result[cpu_result.isfinite()].abs()
        largest = max(1.0, float(finite.max())) if finite.numel() else 1.0
        roundings = 32 * torch.finfo(cpu_result.dtype).eps * largest
        return torch.allclose(got, cpu_result, rtol=1e-5, atol=roundings, equal_nan=True)
    return torch.equal(got, cpu_result)


def identical(device_result: torch.Tensor, cpu_result: torch.Tensor) -> bool:
    """Same dtype, shape and bits (exact, also for floats)."""
    got = device_result.cpu()
    if got.dtype != cpu_result.dtype or got.shape != cpu_result.shape:
        return False
    if got.dtype in _BITS:
        return torch.equal(got.view(_BITS[got.dtype]), cpu_result.view(_BITS[got.dtype]))
    return torch.equal(got, cpu_result)


def same_values(device_result: torch.Tensor, cpu_result: torch.Tensor) -> bool:
    """Same dtype, shape and values; NaN equals NaN and -0.0 equals 0.0 (of equal values,
    which one unique keeps is unspecified: the CPU's unstable sort decides)."""
    got = device_result.cpu()
    if got.dtype != cpu_result.dtype or got.shape != cpu_result.shape:
        return False
    if got.is_floating_point():
        return bool(torch.equal(got.isnan(), cpu_result.isnan())) and torch.equal(
            got.nan_to_num(0.0) + 0.0, cpu_result.nan_to_num(0.0) + 0.0
        )
    return torch.equal(got, cpu_result)


def grads(
    function: Callable[..., torch.Tensor], wrt: int = 99
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The output and the gradients of the first ``wrt`` inputs, for a fixed output gradient."""

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaves = [x.detach().requires_grad_() if i < wrt else x for i, x in enumerate(inputs)]
        out = function(*leaves)
        weights = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)
        (out * weights).sum().backward()
        return (out.detach(), *(x.grad for x in leaves[:wrt]))

    return run


def as_accurate(got: torch.Tensor, cpu: torch.Tensor, exact: torch.Tensor) -> bool:
    """The device's result equals the CPU's to rounding, or, where the two roundings part
    (float32, large matrices), is as near the exact result (float64) as the CPU's, within a
    factor 8: the order of rounding differs, not its size."""
    got = got.cpu()
    if close(got, cpu):
        return True
    floor = torch.finfo(cpu.dtype).eps * float(exact.abs().max())
    cpu_error = max(float((cpu.double() - exact).abs().max()), floor)
    return got.dtype == cpu.dtype and float((got.double() - exact).abs().max()) <= 8 * cpu_error
