"""Antialiased and exact-nearest resizing composed on the device
(``dmlpatch.opfix.vision.resizing``): equal to the CPU forward and backward, no copy through
the host once a size has been seen, where DirectML copies every call down and back."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.e2e.opfix.helpers import no_copies, without_fixes

import dmlpatch.sim as sim

AA_SIZES = [(8, 8), (17, 31), (1, 5), (64, 48)]
AA_OUTPUTS = [(5, 5), (16, 16), (3, 40), (1, 1), (129, 7), (64, 48)]


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got.cpu(), expected)


def _as_exact_as_the_cpu(got: torch.Tensor, cpu: torch.Tensor, exact: torch.Tensor) -> None:
    """No further from float64's answer than twice the CPU's float32 kernel is (the two sum
    the taps in different orders), or within float32's rounding of the values' size."""
    scale = float(exact.abs().max())
    allowed = max(2 * float((cpu.double() - exact).abs().max()), 1e-6 * max(scale, 1.0))
    assert float((got.cpu().double() - exact).abs().max()) <= allowed


def _resize_three_ways(dev: torch.device, x: torch.Tensor, **how: Any) -> list[torch.Tensor]:
    """The resize and the input's gradient on the device, on the CPU in float32 and in
    float64: ``[got, cpu, exact, grad, cpu_grad, exact_grad]``."""
    weights = None
    results: list[list[torch.Tensor]] = []
    for where, dtype in [(dev, torch.float32), ("cpu", torch.float32), ("cpu", torch.float64)]:
        leaf = x.detach().to(where, dtype).requires_grad_()
        out = F.interpolate(leaf, **how)
        if weights is None:
            weights = torch.randn(out.shape)
        out.backward(weights.to(where, dtype))
        assert leaf.grad is not None
        results.append([out.detach(), leaf.grad])
    return [r[0] for r in results] + [r[1] for r in results]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_antialiased_resizes_equal_the_cpu_forward_and_backward(
    dev: torch.device, mode: str, align_corners: bool
) -> None:
    torch.manual_seed(0)
    for (h, w), size in itertools.product(AA_SIZES, AA_OUTPUTS):
        x = torch.randn(2, 3, h, w)
        got, cpu, exact, grad, cpu_grad, exact_grad = _resize_three_ways(
            dev, x, size=size, mode=mode, antialias=True, align_corners=align_corners
        )
        _as_exact_as_the_cpu(got, cpu, exact)
        _as_exact_as_the_cpu(grad, cpu_grad, exact_grad)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("factor", [0.3, 0.77, 1.7, 2.0])
@pytest.mark.parametrize("recompute", [True, False])
def test_antialiased_resizes_by_a_scale_factor_equal_the_cpu(
    dev: torch.device, mode: str, factor: float, recompute: bool
) -> None:
    torch.manual_seed(1)
    x = torch.randn(1, 2, 23, 19)
    got, cpu, exact, grad, cpu_grad, exact_grad = _resize_three_ways(
        dev,
        x,
        scale_factor=factor,
        mode=mode,
        antialias=True,
        recompute_scale_factor=recompute,
    )
    _as_exact_as_the_cpu(got, cpu, exact)
    _as_exact_as_the_cpu(grad, cpu_grad, exact_grad)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_exact_nearest_resizes_equal_the_cpu_bit_for_bit(dev: torch.device, rank: int) -> None:
    torch.manual_seed(2)
    for size, out in [(5, 7), (8, 16), (9, 4), (13, 13), (3, 1)]:
        x = torch.randn((2, 3) + (size,) * rank)
        got, cpu, _, grad, cpu_grad, exact_grad = _resize_three_ways(
            dev, x, size=(out,) * rank, mode="nearest-exact"
        )
        assert torch.equal(got.cpu(), cpu)
        _as_exact_as_the_cpu(grad, cpu_grad, exact_grad)
    for factor, recompute in itertools.product([0.37, 1.3, 2.5], [True, False]):
        x = torch.randn((1, 2) + (11,) * rank)
        how: dict[str, Any] = {"scale_factor": factor, "recompute_scale_factor": recompute}
        expected = F.interpolate(x, mode="nearest-exact", **how)
        assert torch.equal(F.interpolate(x.to(dev), mode="nearest-exact", **how).cpu(), expected)


def test_a_resize_of_a_size_seen_before_copies_nothing_and_launches_six_kernels(
    dev: torch.device,
) -> None:
    x = torch.randn(4, 3, 40, 60).to(dev)
    F.interpolate(x, size=(20, 30), mode="bilinear", antialias=True)  # indices and weights up
    sim.reset_counters()
    F.interpolate(x, size=(20, 30), mode="bilinear", antialias=True)
    counters = sim.counters()
    assert no_copies(counters)
    assert counters["ops"]["fixed"] == {"aten::_upsample_bilinear2d_aa.out": 1}
    launched = {op: n for op, n in counters["ops"]["native"].items() if op != "aten::empty_strided"}
    # Per dimension a gather, a multiply and a sum over the taps; views are free.
    kernels = {op: n for op, n in launched.items() if op != "aten::view"}
    assert kernels == {
        "aten::index_select": 2,
        "aten::mul.out": 2,
        "aten::sum.IntList_out": 2,
    }


def test_without_the_fix_directml_copies_every_resize_through_the_cpu(
    dev: torch.device,
) -> None:
    x = torch.randn(1, 3, 16, 16).to(dev)
    for mode, op in [
        ("bilinear", "aten::_upsample_bilinear2d_aa.out"),
        ("bicubic", "aten::_upsample_bicubic2d_aa.out"),
    ]:
        with without_fixes():
            sim.reset_counters()
            F.interpolate(x, size=(7, 7), mode=mode, antialias=True)
            assert sim.counters()["ops"]["fallback"] == {op: 1}
        sim.reset_counters()
        F.interpolate(x, size=(7, 7), mode=mode, antialias=True)
        assert sim.counters()["ops"]["fallback"] == {}
    with without_fixes():
        sim.reset_counters()
        F.interpolate(x, size=(7, 7), mode="nearest-exact")
        assert sim.counters()["ops"]["fallback"] == {"aten::_upsample_nearest_exact2d.out": 1}


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_float16_antialiased_resizes_compute_in_float32_on_the_device(
    dev: torch.device, mode: str
) -> None:
    torch.manual_seed(3)
    x = torch.randn(1, 2, 20, 20).half()
    expected = F.interpolate(x.float(), size=(9, 9), mode=mode, antialias=True).half()
    sim.reset_counters()
    got = F.interpolate(x.to(dev), size=(9, 9), mode=mode, antialias=True)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.cpu(), expected)
    assert sim.counters()["ops"]["fallback"] == {}


def test_other_dtypes_go_through_the_cpu_as_directml_takes_them(dev: torch.device) -> None:
    x = (torch.rand(1, 3, 20, 20) * 255).to(torch.uint8)
    sim.reset_counters()
    got = F.interpolate(x.to(dev), size=(9, 9), mode="bilinear", antialias=True)
    assert torch.equal(got.cpu(), F.interpolate(x, size=(9, 9), mode="bilinear", antialias=True))
    assert sim.counters()["ops"]["fallback"] == {"aten::_upsample_bilinear2d_aa.out": 1}


def test_torchvision_transforms_resize_a_batch_on_the_device_as_on_the_cpu(
    dev: torch.device,
) -> None:
    from torchvision.transforms import InterpolationMode, v2

    torch.manual_seed(4)
    images = torch.rand(4, 3, 64, 48)
    for transform in [
        v2.Resize((32, 24)),  # antialiased bilinear, the default
        v2.Resize(80, interpolation=InterpolationMode.BICUBIC),
        v2.Resize((17, 33), interpolation=InterpolationMode.NEAREST_EXACT),
    ]:
        sim.reset_counters()
        got = transform(images.to(dev))
        assert sim.counters()["ops"]["fallback"] == {}
        _close(got, transform(images))


@pytest.mark.parametrize(
    ("how", "rank", "layout"),
    [
        ({"mode": "bilinear", "antialias": True}, 2, torch.channels_last),
        ({"mode": "bicubic", "antialias": True}, 2, torch.channels_last),
        ({"mode": "nearest-exact"}, 2, torch.channels_last),
        ({"mode": "nearest-exact"}, 3, torch.channels_last_3d),
    ],
)
def test_a_channels_last_resize_is_laid_out_as_on_the_cpu_and_its_backward_equals_the_cpu(
    dev: torch.device, how: dict[str, Any], rank: int, layout: torch.memory_format
) -> None:
    # torchvision's TestResize::test_kernel_image_memory_format_consistency: the CPU kernels
    # lay the result out as the input suggests, and a batch of channels-last images stays so.
    torch.manual_seed(5)
    x = torch.randn((2, 3) + (9,) * rank).contiguous(memory_format=layout)
    size = (5,) * rank
    expected = F.interpolate(x, size=size, **how)
    got = F.interpolate(x.to(dev), size=size, **how)
    assert got.stride() == expected.stride()
    torch.testing.assert_close(got.cpu(), expected)
    # The backward operator itself (autograd restrides a leaf's gradient to the leaf); the CPU's
    # backward kernels lay their results out each its own way, so only the values are compared.
    mode = how["mode"].replace("-", "_")
    suffix = "_aa" if how.get("antialias") else ""
    backward = getattr(torch.ops.aten, f"_upsample_{mode}{rank}d{suffix}_backward")
    grad = torch.randn(expected.shape).contiguous(memory_format=layout)
    extra = [False] if how.get("antialias") else []
    expected_grad = backward(grad, list(size), list(x.shape), *extra)
    got_grad = backward(grad.to(dev), list(size), list(x.shape), *extra)
    torch.testing.assert_close(got_grad.cpu(), expected_grad)
