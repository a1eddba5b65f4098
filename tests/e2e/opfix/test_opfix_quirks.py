"""Kernels DirectML runs and gets wrong: a tensor times a bool mask is bool, a cross-entropy
with reduction='none' has no gradient, a uint8 sum fails with a garbled error. Without
dmlpatch the simulated device answers as DirectML does; with it, as the CPU does, forward and
backward, and only the calls DirectML gets wrong are counted as fixed."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.e2e.opfix.helpers import close, no_copies, without_fixes

import dmlpatch.sim as sim
from dmlpatch import opfix

MIN = torch.finfo(torch.float32).min


def _causal_mask(cache_position: torch.Tensor) -> torch.Tensor:
    """transformers 4.40's _update_causal_mask, the shape microsoft/DirectML#702 reports."""
    target_length = 6
    mask = torch.full((3, target_length), MIN, device=cache_position.device)
    mask = torch.triu(mask, diagonal=1)
    mask *= torch.arange(target_length, device=cache_position.device) > cache_position.reshape(
        -1, 1
    )
    scores = torch.zeros(3, target_length, device=cache_position.device)
    return scores.masked_fill(mask == MIN, -1.0)


def _scaled_by_mask(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.detach().requires_grad_()
    out = leaf * mask
    out.sum().backward()
    assert leaf.grad is not None
    return out.detach(), leaf.grad


def _in_place(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x *= mask
    return x


#: name: (function of device-or-CPU tensors, CPU inputs, the operator counted as fixed or None)
PRODUCTS: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...], Any]] = {
    "x * mask": (torch.mul, (torch.tensor([0.0, 1.5, -2.0]), torch.tensor([True, True, False])), 1),
    "x *= mask (#686)": (
        _in_place,
        (torch.tensor([0.0, 1.0]), torch.tensor([False, True])),
        1,
    ),
    "x.mul_(mask) (#737)": (
        lambda x, m: x.clone().mul_(m),
        (torch.full((4,), -3.4e38), torch.tensor([True, False, True, False])),
        1,
    ),
    "broadcast mask, half": (
        torch.mul,
        (torch.randn(2, 3).half(), torch.tensor([[True], [False]])),
        1,
    ),
    "int * mask": (torch.mul, (torch.tensor([3, -4, 5]), torch.tensor([True, False, True])), 1),
    "gradient through the mask": (  # the backward multiplies by the mask too
        _scaled_by_mask,
        (torch.randn(3, 4), torch.rand(3, 4) > 0.5),
        2,
    ),
    "transformers causal mask (#702)": (_causal_mask, (torch.tensor([2, 3, 4]),), 1),
    "bool * bool": (torch.mul, (torch.tensor([True, False]), torch.tensor([True, True])), 0),
    "mask * x": (torch.mul, (torch.tensor([True, False]), torch.tensor([2.0, 3.0])), 0),
    "x * y": (torch.mul, (torch.randn(5), torch.randn(5)), 0),
    "x * 3": (lambda x: x * 3, (torch.randn(5),), 0),
    "ints * 2.5": (lambda x: x * 2.5, (torch.arange(4),), 0),
    "x * int tensor": (torch.mul, (torch.randn(4), torch.arange(4)), 0),
    "CPU scalar tensor * x": (lambda x: torch.tensor(0.5) * x, (torch.randn(4),), 0),
    "x * CPU scalar tensor": (lambda x: x * torch.tensor(3), (torch.randn(4),), 0),
    # Not pinned by the reports (a CPU scalar as self); the mask is cast all the same.
    "CPU float scalar * mask": (lambda m: torch.tensor(2.0) * m, (torch.rand(5) > 0.5,), 1),
}


def _cross_entropy(**options: Any) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def run(
        logits: torch.Tensor, target: torch.Tensor, *weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = logits.detach().requires_grad_()
        loss = F.cross_entropy(
            leaf, target, weight=weight[0] if weight else None, reduction="none", **options
        )
        per_row = torch.linspace(0.5, 2.0, loss.numel(), device=leaf.device).reshape(loss.shape)
        (loss * per_row).sum().backward()
        assert leaf.grad is not None
        return loss.detach(), leaf.grad

    return run


LOSSES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "per-token loss (#739)": (_cross_entropy(), (torch.randn(8, 11), torch.randint(0, 11, (8,)))),
    "ignore_index": (
        _cross_entropy(ignore_index=-100),
        (torch.randn(6, 5), torch.tensor([1, -100, 3, 0, -100, 4])),
    ),
    "class weights": (
        _cross_entropy(),
        (torch.randn(6, 5), torch.tensor([1, 2, 3, 0, 2, 4]), torch.rand(5)),
    ),
    "one sample": (_cross_entropy(), (torch.randn(7), torch.tensor(3))),
    "label smoothing": (
        _cross_entropy(label_smoothing=0.1),
        (torch.randn(6, 5), torch.tensor([1, 2, 3, 0, 2, 4])),
    ),
}

SUMS: dict[str, tuple[Callable[..., Any], torch.Tensor, int]] = {
    "uint8 sum (#619)": (torch.sum, torch.tensor([1], dtype=torch.uint8), 1),
    "uint8 sum over a dim, keepdim": (
        lambda t: t.sum(1, keepdim=True),
        torch.randint(0, 255, (3, 4), dtype=torch.uint8),
        1,
    ),
    "uint8 sum as uint8 wraps": (
        lambda t: t.sum(dtype=torch.uint8),
        torch.tensor([200, 100], dtype=torch.uint8),
        1,
    ),
    "uint8 sum as float": (
        lambda t: t.sum(0, dtype=torch.float32),
        torch.randint(0, 255, (5, 2), dtype=torch.uint8),
        1,
    ),
    "float sum": (lambda t: t.sum((0, 1)), torch.randn(3, 4, 5), 0),
    "bool sum": (torch.sum, torch.rand(9) > 0.5, 0),
    "int32 sum": (lambda t: t.sum(0), torch.arange(12, dtype=torch.int32).reshape(3, 4), 0),
}


def _results(value: Any) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _check(dev: torch.device, function: Callable[..., Any], inputs: tuple[torch.Tensor, ...]):
    expected = _results(function(*inputs))
    on_device = [x.to(dev) for x in inputs]
    sim.reset_counters()
    got = _results(function(*on_device))
    counters = sim.counters()
    assert len(got) == len(expected)
    for device_result, cpu_result in zip(got, expected):
        assert device_result.device == dev
        assert close(device_result, cpu_result), (device_result.cpu(), cpu_result)
    return counters


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_products_with_masks_equal_the_cpu(dev: torch.device, name: str) -> None:
    function, inputs, fixed = PRODUCTS[name]
    counters = _check(dev, function, inputs)
    assert no_copies(counters), counters
    assert counters["ops"]["fixed"].get("aten::mul.out", 0) == fixed, counters["ops"]["fixed"]


def test_without_dmlpatch_a_product_with_a_mask_is_bool(dev: torch.device) -> None:
    x = torch.tensor([0.0, 1.0], device=dev)
    positions = torch.tensor([2, 3, 4])
    with without_fixes():
        x *= x > 0
        y = torch.full((4,), -3.4e38, device=dev) * torch.tensor(
            [True, False, True, False], device=dev
        )
        scores = _causal_mask(positions.to(dev))
    assert x.dtype == torch.bool and x.cpu().tolist() == [False, True]
    assert y.dtype == torch.bool and y.cpu().tolist() == [True, False, True, False]
    # The causal mask turned bool, so no position is masked: attention sees the future.
    assert scores.cpu().tolist() == [[0.0] * 6] * 3
    assert _causal_mask(positions).tolist() != scores.cpu().tolist()


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_cross_entropy_none_gradients_equal_the_cpu(dev: torch.device, name: str) -> None:
    function, inputs = LOSSES[name]
    counters = _check(dev, function, inputs)
    assert no_copies(counters), counters
    fixed = counters["ops"]["fixed"]
    assert fixed.get("aten::nll_loss_backward.grad_input") == 1, fixed


def test_without_dmlpatch_cross_entropy_none_has_no_gradient(dev: torch.device) -> None:
    function, (logits, target) = LOSSES["per-token loss (#739)"]
    with without_fixes():
        loss, gradient = function(logits.to(dev), target.to(dev))
        mean_logits = logits.to(dev).requires_grad_()
        F.cross_entropy(mean_logits, target.to(dev)).backward()
    expected_loss, expected_gradient = function(logits, target)
    assert close(loss, expected_loss)  # the loss is right...
    assert expected_gradient.abs().sum() > 0
    assert torch.count_nonzero(gradient.cpu()) == 0  # ...and the gradient is all zeros
    assert mean_logits.grad is not None and torch.count_nonzero(mean_logits.grad.cpu()) > 0


@pytest.mark.parametrize("name", sorted(SUMS))
def test_sums_equal_the_cpu(dev: torch.device, name: str) -> None:
    function, tensor, fixed = SUMS[name]
    counters = _check(dev, function, (tensor,))
    assert no_copies(counters), counters
    assert counters["ops"]["fixed"].get("aten::sum.IntList_out", 0) == fixed


def test_without_dmlpatch_a_uint8_sum_fails_with_a_garbled_error(dev: torch.device) -> None:
    t = torch.tensor([1], dtype=torch.uint8, device=dev)
    with without_fixes(), pytest.raises(UnicodeDecodeError, match="byte 0xcf in position 0"):
        t.sum()


#: Copies of a device tensor: the fix for copies between adapters serves every ``_to_copy``
#: of one, so each must keep PyTorch's layout rules (strides kept where dense). name:
#: (copy, whether it goes to the host)
COPIES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], bool]] = {
    "to float16": (lambda t: t.to(torch.float16), False),
    "cpu": (lambda t: t.cpu(), True),
    "to cpu as int32": (lambda t: t.to("cpu", torch.int32), True),
    "cpu non_blocking": (lambda t: t.to("cpu", non_blocking=True), True),
    "channels_last kept": (
        lambda t: t.to(memory_format=torch.channels_last).to(torch.float64),
        False,
    ),
    "non-dense view": (lambda t: t[:, ::2].transpose(0, 1).to(torch.float16), False),
    "contiguous asked": (
        lambda t: t.transpose(1, 3).to(torch.float16, memory_format=torch.contiguous_format),
        False,
    ),
    "same device, copy=True": (lambda t: t.to(t.device, copy=True), False),
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_copies_of_a_device_tensor_keep_pytorchs_layout(dev: torch.device, name: str) -> None:
    copy, to_host = COPIES[name]
    cpu = torch.randn(2, 3, 4, 5)
    expected = copy(cpu)
    got = copy(cpu.to(dev))
    assert got.device == (torch.device("cpu") if to_host else dev)
    assert got.dtype == expected.dtype and got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32)


@st.composite
def _operands(draw: st.DrawFn) -> tuple[torch.Tensor, Any, str]:
    """A device-bound tensor and another operand: a tensor for the device, a CPU scalar
    tensor, or a Python number."""
    shape = draw(st.sampled_from([(3,), (2, 3), (1, 3), ()]))
    count = 1
    for size in shape:
        count *= size
    a = (torch.arange(count) - 2).reshape(shape).to(draw(st.sampled_from(_DTYPES)))
    kind = draw(st.sampled_from(["tensor", "cpu scalar", "number"]))
    if kind == "number":
        return a, draw(st.sampled_from([2, -1.5, True])), kind
    other_shape = draw(st.sampled_from([(3,), (2, 1), ()])) if kind == "tensor" else ()
    other = torch.full(other_shape, draw(st.sampled_from([0, 1, 3])))
    return a, other.to(draw(st.sampled_from(_DTYPES))), kind


def _outcome(call: Callable[[], torch.Tensor]) -> Any:
    try:
        result = call()
    except RuntimeError as error:
        return type(error).__name__, str(error)
    return result.dtype, tuple(result.shape), result.stride(), result.cpu().double().tolist()


@settings(max_examples=150, deadline=None)
@given(_operands(), st.booleans(), st.booleans())
def test_every_product_equals_the_cpu(
    dev: torch.device, operands: tuple[torch.Tensor, Any, str], in_place: bool, swap: bool
) -> None:
    opfix.arm_all()  # the product fix, as once a bool tensor has been on the device
    a, b, kind = operands
    moved = b.to(dev) if kind == "tensor" else b
    if in_place:
        expected = _outcome(lambda: a.clone().mul_(b))
        got = _outcome(lambda: a.to(dev).mul_(moved))
    elif swap and kind == "number":  # torch.mul(-1, x): kornia's __rmul__
        expected = _outcome(lambda: torch.mul(b, a))
        got = _outcome(lambda: torch.mul(moved, a.to(dev)))
    elif swap:
        expected = _outcome(lambda: b * a)
        got = _outcome(lambda: moved * a.to(dev))
    else:
        expected = _outcome(lambda: a * b)
        got = _outcome(lambda: a.to(dev) * moved)
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(_DTYPES),
    st.sampled_from([None, 0, 1, (0, 1), ()]),
    st.booleans(),
    st.sampled_from([None, torch.uint8, torch.int64, torch.float32]),
)
def test_every_sum_equals_the_cpu(
    dev: torch.device, dtype: torch.dtype, dim: Any, keepdim: bool, into: Any
) -> None:
    opfix.arm_all()
    t = (torch.arange(12).reshape(3, 4) * 37 % 256).to(dtype)
    options: dict[str, Any] = {} if into is None else {"dtype": into}
    if dim is None:
        expected = _outcome(lambda: t.sum(**options))
        got = _outcome(lambda: t.to(dev).sum(**options))
    else:
        expected = _outcome(lambda: t.sum(dim, keepdim, **options))
        got = _outcome(lambda: t.to(dev).sum(dim, keepdim, **options))
    assert got == expected


#: Operands whose products PyTorch lays out by their strides: channels_last, views whose
#: size-1 dimensions have unusual strides, a non-dense view. name: (tensor, view of it)
LAYOUTS: dict[str, tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]] = {
    "channels_last": (
        torch.randn(2, 3, 4, 5),
        lambda t: t.contiguous(memory_format=torch.channels_last),
    ),
    "channels_last, one channel": (
        torch.randn(2, 1, 4, 5),
        lambda t: t.contiguous(memory_format=torch.channels_last),
    ),
    "transposed row": (torch.randn(1, 4), lambda t: t.t()),
    "permuted size-1 dimension": (torch.randn(2, 1, 3), lambda t: t.permute(1, 0, 2)),
    "non-dense view": (torch.randn(4, 6), lambda t: t[:, ::2].t()),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_products_and_sums_keep_the_layout(dev: torch.device, name: str) -> None:
    """Fixed products and sums are laid out as PyTorch's own kernels lay them out."""
    opfix.arm_all()
    base, view = LAYOUTS[name]
    x, d = view(base), view(base.to(dev))
    assert d.stride() == x.stride()
    last = x.dim() - 1
    for got, expected in (
        (d * d, x * x),
        (d * 2, x * 2),
        (d * 0.5, x * 0.5),
        (torch.tensor(2.0) * d, torch.tensor(2.0) * x),
        (d * torch.tensor(3.0).to(dev), x * torch.tensor(3.0)),
        (d * torch.ones(x.shape[-1]).to(dev), x * torch.ones(x.shape[-1])),
        (d.sum(last, keepdim=True), x.sum(last, keepdim=True)),
        (d.sum(0), x.sum(0)),
        (d.clone().mul_(2), x.clone().mul_(2)),
    ):
        assert got.shape == expected.shape and got.stride() == expected.stride()
        assert torch.allclose(got.cpu(), expected)
