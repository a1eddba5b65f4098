"""avg_pool divisor_override, high-rank repeat, partial scatter, DMLPATCH_CPU_OPS: refused (or
slow) without dmlpatch on the 0.2.5 profile, equal to the CPU on the device with it."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.e2e.opfix.helpers import identical, no_copies, without_fixes

import dmlpatch.sim as sim

DIVISOR = "Divisor override isn't supported for DirectML."


# ---- avg_pool with divisor_override ----


@st.composite
def pool_cases(draw: st.DrawFn) -> tuple[torch.Tensor, dict[str, object], int]:
    rank = draw(st.sampled_from((2, 3)))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    stride = [draw(st.integers(1, 3)) for _ in range(rank)]
    padding = [draw(st.integers(0, k // 2)) for k in kernel]
    sizes = [draw(st.integers(k, k + 5)) for k in kernel]
    batch = draw(st.lists(st.integers(1, 2), min_size=1, max_size=2))
    dtype = draw(st.sampled_from((torch.float32, torch.float64, torch.int64)))
    if dtype == torch.int64:
        x = torch.randint(-50, 50, (*batch, *sizes))
    else:
        x = torch.randn(*batch, *sizes, dtype=dtype)
    options = {
        "kernel_size": kernel,
        "stride": draw(st.sampled_from((stride, None))),
        "padding": padding,
        "ceil_mode": draw(st.booleans()),
        "count_include_pad": draw(st.booleans()),
        "divisor_override": draw(st.integers(1, 9)),
    }
    return x, options, rank


def _pool(x: torch.Tensor, rank: int, options: dict[str, Any]) -> torch.Tensor:
    return (F.avg_pool2d if rank == 2 else F.avg_pool3d)(x, **options)


@settings(max_examples=80, deadline=None)
@given(pool_cases())
def test_avg_pool_divisor_equals_cpu(
    dev: torch.device, case: tuple[torch.Tensor, dict[str, object], int]
) -> None:
    x, options, rank = case
    expected = _pool(x, rank, options)
    on_device = x.to(dev)
    sim.reset_counters()
    got = _pool(on_device, rank, options)
    counters = sim.counters()
    assert no_copies(counters), counters
    assert counters["ops"]["fixed"] == {f"aten::avg_pool{rank}d": 1}
    if x.is_floating_point():
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)
    else:
        assert identical(got, expected)


def test_avg_pool_divisor_refused_without_dmlpatch_and_gradient(dev: torch.device) -> None:
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    options: dict[str, Any] = {
        "kernel_size": 3,
        "stride": 2,
        "padding": 1,
        "ceil_mode": True,
        "divisor_override": 4,
    }
    with without_fixes(), pytest.raises(RuntimeError) as refused:
        F.avg_pool2d(x.detach().to(dev), **options)
    assert str(refused.value) == DIVISOR
    x3 = torch.randn(1, 2, 4, 5, 6)
    with without_fixes(), pytest.raises(RuntimeError, match=r"^Divisor override isn't"):
        F.avg_pool3d(x3.to(dev), 2, divisor_override=3)

    on_device = x.detach().to(dev).requires_grad_()
    sim.reset_counters()
    out = F.avg_pool2d(on_device, **options)
    (out * out).sum().backward()
    counters = sim.counters()
    assert no_copies(counters), counters
    expected = F.avg_pool2d(x, **options)
    (expected * expected).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(on_device.grad.cpu(), x.grad, rtol=1e-6, atol=1e-6)
    # Without divisor_override, DirectML's own kernel runs (counted native, not fixed).
    sim.reset_counters()
    F.avg_pool2d(on_device, 2)
    assert sim.counters()["ops"]["fixed"] == {}


# ---- repeat beyond 4 dimensions ----


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=0, max_size=5),
    st.data(),
)
def test_repeat_equals_cpu(dev: torch.device, shape: list[int], data: st.DataObject) -> None:
    extra = data.draw(st.integers(0, 6 - len(shape)))
    repeats = data.draw(
        st.lists(st.integers(0, 3), min_size=len(shape) + extra, max_size=len(shape) + extra)
    )
    x = torch.arange(int(torch.tensor(shape).prod()) if shape else 1, dtype=torch.float32)
    x = x.reshape(shape)
    expected = x.repeat(repeats)
    on_device = x.to(dev)
    sim.reset_counters()
    got = on_device.repeat(repeats)
    counters = sim.counters()
    assert no_copies(counters), counters
    assert counters["ops"]["fixed"] == ({"aten::repeat": 1} if len(repeats) > 4 else {})
    assert identical(got, expected)
    assert got.is_contiguous()


def test_repeat_refused_without_dmlpatch_and_gradient(dev: torch.device) -> None:
    x = torch.randn(2, 1, 3, 1, 2, requires_grad=True)
    repeats = (1, 2, 1, 3, 2)
    with without_fixes(), pytest.raises(RuntimeError) as refused:
        x.detach().to(dev).repeat(repeats)
    assert str(refused.value) == "the dimesion of at::Tensor must be 4 or lower, but got 5"
    on_device = x.detach().to(dev).requires_grad_()
    sim.reset_counters()
    out = on_device.repeat(repeats)
    weights = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape)
    (out * weights.to(dev)).sum().backward()
    (x.repeat(repeats) * weights).sum().backward()
    assert identical(out.detach(), x.detach().repeat(repeats))
    assert identical(on_device.grad, x.grad)


# ---- scatter with an index smaller than self or src ----


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_scatter_equals_cpu(dev: torch.device, data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 3))
    shape = [data.draw(st.integers(1, 4)) for _ in range(rank)]
    dim = data.draw(st.integers(-rank, rank - 1))
    index_shape = [
        data.draw(st.integers(1, 4 if d == dim % rank else s)) for d, s in enumerate(shape)
    ]
    index = torch.randint(0, shape[dim], index_shape)
    src_shape = [s + data.draw(st.integers(0, 2)) for s in index_shape]
    src = torch.randn(src_shape)
    base = torch.randn(shape)
    variant = data.draw(st.sampled_from(("src", "value", "reduce", "inplace_src", "inplace_value")))

    def call(self: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if variant == "src":
            return self.scatter(dim, i, s)
        if variant == "value":
            return self.scatter(dim, i, 2.5)
        if variant == "reduce":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # reduce= with a src tensor is deprecated
                return self.scatter(dim, i, s, reduce="add")
        if variant == "inplace_src":
            return self.clone().scatter_(dim, i, s)
        return self.clone().scatter_(dim, i, -1.0, reduce="multiply")

    expected = call(base, index, src)
    args = (base.to(dev), index.to(dev), src.to(dev))
    sim.reset_counters()
    got = call(*args)
    counters = sim.counters()
    assert no_copies(counters), counters
    assert identical(got, expected)


def test_scatter_refused_without_dmlpatch_and_gradient(dev: torch.device) -> None:
    base = torch.randn(4, 5, requires_grad=True)
    index = torch.tensor([[0, 3], [2, 1]])
    src = torch.randn(3, 3, requires_grad=True)
    with without_fixes():
        with pytest.raises(RuntimeError) as shape_refused:
            base.detach().to(dev).scatter(0, index.to(dev), src.detach().to(dev))
        with pytest.raises(RuntimeError) as partial_refused:
            base.detach().to(dev).scatter(0, index.to(dev), 1.0)
    assert str(shape_refused.value) == (
        "DirectML scatter doesn't allow for index and source to have different dimensions."
    )
    assert str(partial_refused.value).startswith(
        "DirectML scatter doesn't allow partially modified dimensions."
    )
    # Gradients: PyTorch's own formula needs src shaped like index (also on the CPU); the index
    # still covers only part of self's second dimension, which DirectML refuses.
    src = torch.randn(2, 2, requires_grad=True)
    b, s = base.detach().to(dev).requires_grad_(), src.detach().to(dev).requires_grad_()
    i = index.to(dev)
    sim.reset_counters()
    out = b.scatter(0, i, s)
    (out * out).sum().backward()
    counters = sim.counters()
    assert no_copies(counters), counters
    assert counters["ops"]["fixed"]["aten::scatter.src"] == 1
    # the gradient of self is grad.scatter(dim, index, 0): refused too, fixed too
    assert counters["ops"]["fixed"]["aten::scatter.value"] == 1
    expected = base.scatter(0, index, src)
    (expected * expected).sum().backward()
    assert identical(out.detach(), expected.detach())
    assert identical(b.grad, base.grad) and identical(s.grad, src.grad)


def test_scatter_errors_are_pytorchs(dev: torch.device) -> None:
    base = torch.zeros(2, 2, device=dev)
    too_big = torch.zeros(3, 1, dtype=torch.long, device=dev)
    with pytest.raises(RuntimeError, match="Expected index"):
        base.scatter(1, too_big, torch.ones(3, 3, device=dev))
