"""unique on the device: refused by DirectML without dmlpatch, equal to the CPU with it."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.e2e.opfix.helpers import no_copies, same_values, without_fixes

import dmlpatch.sim as sim

# What these tests check is the compositions: the cost model would send some of these small
# calls through the fallback (test_opfix_fix_costs checks the choice).
pytestmark = pytest.mark.usefixtures("composed")

DTYPES = (
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.float32,
    torch.float64,
    torch.float16,
)  # no bfloat16: no DirectML tensor can have it (microsoft/DirectML#688)
SPECIALS = (0.0, -0.0, float("nan"))


@st.composite
def tensors(draw: st.DrawFn, specials: bool = True, min_dims: int = 0) -> torch.Tensor:
    """Small tensors with many repeated values (and NaN, -0.0 for floating dtypes)."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=min_dims, max_size=3))
    count = 1
    for size in shape:
        count *= size
    values = draw(st.lists(st.integers(0, 4), min_size=count, max_size=count))
    tensor = torch.tensor(values, dtype=torch.int64).reshape(shape)
    if dtype == torch.bool:
        return tensor > 2
    tensor = tensor.to(dtype)
    if tensor.is_floating_point() and count and specials:
        picks = draw(st.lists(st.integers(0, count - 1), max_size=3))
        flat = tensor.reshape(-1)
        for pick in picks:
            flat[pick] = draw(st.sampled_from(SPECIALS))
    if draw(st.booleans()) and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)  # non-contiguous input
    return tensor


def _on_device(
    call: Callable[[torch.Tensor], Any], cpu: torch.Tensor, dev: torch.device
) -> tuple[Any, dict[str, Any]]:
    on_device = cpu.to(dev)
    sim.reset_counters()
    result = call(on_device)
    return result, sim.counters()


def _check(call: Callable[[torch.Tensor], Any], cpu: torch.Tensor, dev: torch.device) -> None:
    expected = call(cpu)
    result, counters = _on_device(call, cpu, dev)
    assert no_copies(counters), counters
    if isinstance(expected, torch.Tensor):
        expected, result = (expected,), (result,)
    assert len(result) == len(expected)
    for got, want in zip(result, expected):
        assert got.device == dev
        assert same_values(got, want), (cpu, got, want)


@settings(max_examples=150, deadline=None)
@given(tensors(), st.booleans(), st.booleans(), st.booleans())
def test_unique2_equals_cpu(
    dev: torch.device, cpu: torch.Tensor, ordered: bool, inverse: bool, counts: bool
) -> None:
    call = lambda t: torch.ops.aten._unique2(t, ordered, inverse, counts)  # noqa: E731
    if not (cpu.is_floating_point() and cpu.isnan().any() and inverse):
        _check(call, cpu, dev)
        return
    # Each NaN is its own group; which NaN gets which group number follows the sort, and the
    # CPU's sort is unstable: compare the other positions exactly, NaN groups as a set.
    values, got, got_counts = _on_device(call, cpu, dev)[0]
    want_values, want, want_counts = call(cpu)
    assert same_values(values, want_values) and same_values(got_counts, want_counts)
    nan = cpu.isnan()
    got = got.cpu()
    assert torch.equal(got[~nan], want[~nan])
    assert torch.equal(got[nan].sort().values, want[nan].sort().values)


@settings(max_examples=60, deadline=None)
@given(tensors(), st.booleans(), st.booleans())
def test_unique_consecutive_equals_cpu(
    dev: torch.device, cpu: torch.Tensor, inverse: bool, counts: bool
) -> None:
    _check(lambda t: torch.ops.aten.unique_consecutive(t, inverse, counts), cpu, dev)


@settings(max_examples=100, deadline=None)
@given(tensors(specials=False, min_dims=1), st.data(), st.booleans(), st.booleans())
def test_unique_dim_equals_cpu(
    dev: torch.device, cpu: torch.Tensor, data: st.DataObject, inverse: bool, counts: bool
) -> None:
    # NaN has no place in the CPU's lexicographic row order (its comparator is undefined for
    # it), so rows are compared without NaN; -0.0/0.0 compare equal and come out as 0.0.
    dim = data.draw(st.integers(-cpu.dim(), cpu.dim() - 1))
    consecutive = data.draw(st.booleans())
    if consecutive:
        call = lambda t: torch.unique_consecutive(  # noqa: E731
            t, return_inverse=True, return_counts=counts, dim=dim
        )
    else:
        call = lambda t: torch.unique(  # noqa: E731
            t, sorted=True, return_inverse=inverse, return_counts=counts, dim=dim
        )
    try:
        expected = call(cpu)
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=str(error).strip()[:40]):
            call(cpu.to(dev))
        return
    _check(call, cpu, dev)
    assert expected is not None


def test_public_api_shapes(dev: torch.device) -> None:
    x = torch.tensor([[3, 1, 3], [1, 1, 7]])
    for call in (
        lambda t: t.unique(),
        lambda t: t.unique(sorted=False, return_inverse=True),
        lambda t: torch.unique(t, return_counts=True),
        lambda t: torch.unique(t, return_inverse=True, return_counts=True),
        lambda t: torch.unique(t, dim=1, return_inverse=True),
        lambda t: torch.unique_consecutive(t, return_counts=True),
        lambda t: torch.unique_consecutive(t, return_inverse=True, dim=0),
        lambda t: torch._unique(t, return_inverse=True),
        lambda t: torch.unique(t[1, 2], return_inverse=True, return_counts=True),
    ):
        _check(call, x, dev)


def test_refused_without_dmlpatch_and_counted_as_fixed_with_it(dev: torch.device) -> None:
    batch_idx = torch.tensor([0, 0, 1, 3, 3, 3], device=dev)  # ultralytics' loss, every step
    with without_fixes():
        with pytest.raises(
            RuntimeError,
            match=r"^Return counts not implemented for unique operator for DirectML\.$",
        ):
            batch_idx.unique(return_counts=True)
        with pytest.raises(
            RuntimeError,
            match=r"^Return inverse not implemented for unique operator for DirectML\.$",
        ):
            batch_idx.unique(return_inverse=True)
    sim.reset_counters()
    values, counts = batch_idx.unique(return_counts=True)
    batch_idx.unique()  # DirectML's own kernel: not a fixed call
    counters = sim.counters()
    assert counters["ops"]["fixed"] == {"aten::_unique2": 1}
    assert counters["ops"]["native"]["aten::_unique2.out"] == 1  # DirectML's kernel
    assert no_copies(counters)
    assert values.tolist() == [0, 1, 3] and counts.tolist() == [2, 1, 3]


def test_fallback_variants_run_on_the_device(dev: torch.device) -> None:
    x = torch.tensor([[1, 2], [1, 2], [0, 5]], device=dev)
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DirectML's fallback warning (once per process)
        sim.reset_counters()
        torch.unique(x, dim=0)
        torch.unique_consecutive(x)
        fallback = sim.counters()
    assert set(fallback["ops"]["fallback"]) == {"aten::unique_dim", "aten::unique_consecutive"}
    assert fallback["copies"]["aten::unique_dim"]["count"] == 4  # x out; 3 results back
    sim.reset_counters()
    torch.unique(x, dim=0)
    torch.unique_consecutive(x)
    fixed = sim.counters()
    assert fixed["ops"]["fixed"] == {"aten::unique_dim": 1, "aten::unique_consecutive": 1}
    assert no_copies(fixed)


def test_grad_mode_and_requires_grad_inputs(dev: torch.device) -> None:
    # unique has no derivative; it accepts a tensor that requires grad, as on the CPU.
    x = torch.tensor([1.0, 2.0, 2.0], requires_grad=True)
    values, counts = x.to(dev).unique(return_counts=True)
    assert values.requires_grad == x.unique(return_counts=True)[0].requires_grad
    assert counts.tolist() == [1, 2] and not counts.requires_grad
    with torch.inference_mode():
        values, inverse = torch.tensor([2, 1, 2], device=dev).unique(return_inverse=True)
    assert inverse.tolist() == [1, 0, 1]
