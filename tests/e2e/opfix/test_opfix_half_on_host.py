"""float16 through the CPU fallback (``dmlpatch.opfix.precision.half_on_host``): operators
DirectML sends to the CPU whose CPU kernel has no float16 run there in float32 and come back
as float16, counted as fallbacks; without dmlpatch a float16 program stops there."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.e2e.opfix.helpers import without_fixes

import dmlpatch.sim as sim


def _pooled() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return F.max_pool2d(torch.randn(1, 2, 8, 8), 2, return_indices=True)


CASES: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "multi_margin_loss": (
        "aten::multi_margin_loss",
        lambda x: F.multi_margin_loss(x.reshape(16, 8), torch.arange(16).remainder(8).to(x.device)),
    ),
    "trace": ("aten::trace", lambda x: torch.trace(x[0, 0])),
    "max_unpool2d": (
        "aten::max_unpool2d",
        lambda x: F.max_unpool2d(x[:, :, :4, :4], _pooled()[1].to(x.device), 2),
    ),
    "adaptive_max_pool3d": (
        "aten::adaptive_max_pool3d.out",  # DirectML names a structured operator by its out=
        lambda x: F.adaptive_max_pool3d(x, 3),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_float16_fallbacks_without_a_cpu_kernel_run_in_float32(
    dev: torch.device, name: str
) -> None:
    op, run = CASES[name]
    torch.manual_seed(1)
    x = torch.randn(1, 2, 8, 8).half()
    expected = run(x.float()).half()
    sim.reset_counters()
    got = run(x.to(dev))
    assert got.dtype == torch.float16 and got.device == dev
    assert torch.equal(got.cpu(), expected)
    assert sim.counters()["ops"]["fallback"] == {op: 1}


def test_without_dmlpatch_a_float16_resize_stops(dev: torch.device) -> None:
    x = torch.randn(1, 2, 8, 8).half().to(dev)
    with without_fixes(), pytest.raises(RuntimeError, match="not implemented for 'Half'"):
        F.interpolate(x, size=(5, 5), mode="bilinear", antialias=True)


def test_float32_calls_are_directmls_fallback(dev: torch.device) -> None:
    x = torch.randn(1, 2, 8, 8)
    sim.reset_counters()
    got = F.adaptive_max_pool3d(x.to(dev), 3)
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), F.adaptive_max_pool3d(x, 3))
    assert sim.counters()["ops"]["fallback"] == {"aten::adaptive_max_pool3d.out": 1}


def test_where_the_cpu_has_float16_its_own_kernel_runs(dev: torch.device) -> None:
    # histc has a float16 CPU kernel on torch 2.4.1 and 2.14.1, whose bins differ from
    # float32's at their edges (PyTorch's own samples found it): the device's equal the CPU's.
    torch.manual_seed(66)
    x = (torch.rand(20) * 20 - 10).half()
    expected = torch.histc(x, 7, -10, 10)
    assert not torch.equal(expected, torch.histc(x.float(), 7, -10, 10).half())
    sim.reset_counters()
    got = torch.histc(x.to(dev), 7, -10, 10)
    assert got.dtype == torch.float16 and torch.equal(got.cpu(), expected)
    assert sim.counters()["ops"]["fallback"] == {"aten::histc": 1}


def _padded_on_cpu(
    pad: torch.nn.Module, x: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU's float16 result and gradient, or where its kernels have no float16 (torch 2.4),
    float32's from the same float16 values, rounded once."""
    try:
        leaf = x.clone().requires_grad_()
        out = pad(leaf)
        (out * weights).sum().backward()
        assert leaf.grad is not None
        return out.detach(), leaf.grad
    except (NotImplementedError, RuntimeError) as error:
        assert "not implemented for 'Half'" in str(error)
    leaf = x.float().requires_grad_()
    out = pad(leaf)
    (out * weights.float()).sum().backward()
    assert leaf.grad is not None
    return out.detach().half(), leaf.grad.half()


@pytest.mark.parametrize(
    ("module", "dims"),
    [
        (torch.nn.ReplicationPad1d, 1),
        (torch.nn.ReplicationPad2d, 2),
        (torch.nn.ReplicationPad3d, 3),
        (torch.nn.ReflectionPad1d, 1),
        (torch.nn.ReflectionPad2d, 2),
    ],
)
def test_float16_padding_trains_as_on_the_cpu(
    dev: torch.device, module: Callable[[int], torch.nn.Module], dims: int
) -> None:
    """Padding a float16 activation (a generator's ReflectionPad2d under autocast): torch
    2.4's CPU has no float16 kernel for it, so where DirectML falls back (replication's
    backward, 3d) a float16 program stopped there; the simulated device's own kernels (1d and
    2d forward) likewise. The results are the CPU's float16 ones where it has them (torch
    2.14), float32's rounded once where not."""
    torch.manual_seed(0)
    pad = module(2)
    x = torch.randn(2, 3, *([6] * dims)).half()
    weights = torch.randn(pad(x.float()).shape).half()
    expected, expected_grad = _padded_on_cpu(pad, x, weights)
    leaf = x.to(dev).requires_grad_()
    out = pad(leaf)
    (out * weights.to(dev)).sum().backward()
    assert out.dtype == torch.float16 and torch.equal(out.detach().cpu(), expected)
    assert leaf.grad is not None and leaf.grad.dtype == torch.float16
    assert torch.equal(leaf.grad.cpu(), expected_grad)


def test_padding_directml_serves_stays_its_own(dev: torch.device) -> None:
    """DirectML registers reflection_pad1d.out and replication_pad1d/2d.out, which serve their
    functional forms: no fallback is installed over them, whatever the dtype."""
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(2, 3, 6, 6, dtype=dtype)
        sim.reset_counters()
        for pad in (torch.nn.ReflectionPad1d(2), torch.nn.ReplicationPad1d(2)):
            assert torch.equal(pad(x[0].to(dev)).cpu(), pad(x[0].float()).to(dtype))
        padded = torch.nn.ReplicationPad2d(2)(x.to(dev))
        assert torch.equal(padded.cpu(), torch.nn.ReplicationPad2d(2)(x.float()).to(dtype))
        assert sim.counters()["ops"]["fallback"] == {}


def test_float16_distances_train_as_in_float32(dev: torch.device) -> None:
    """cdist's backward and pdist have no float16 CPU kernel (torch 2.4 to 2.14); CUDA's have:
    through the fallback they compute in float32. The forward is float32's rounded once; the
    gradient follows float32's within float16's rounding of the distances it is given."""
    torch.manual_seed(0)
    a, b = torch.randn(2, 5, 3).half(), torch.randn(2, 4, 3).half()
    wide = a.float().requires_grad_(), b.float().requires_grad_()
    (torch.cdist(*wide).sum() + F.pdist(wide[0][0]).sum()).backward()
    leaves = a.to(dev).requires_grad_(), b.to(dev).requires_grad_()
    distances, pairs = torch.cdist(*leaves), F.pdist(leaves[0][0])
    (distances.sum() + pairs.sum()).backward()
    assert distances.dtype == pairs.dtype == torch.float16
    assert torch.equal(distances.detach().cpu(), torch.cdist(*wide).detach().half())
    assert torch.equal(pairs.detach().cpu(), F.pdist(wide[0][0]).detach().half())
    for leaf, expected in zip(leaves, wide):
        assert leaf.grad is not None and leaf.grad.dtype == torch.float16
        torch.testing.assert_close(leaf.grad.cpu().float(), expected.grad, rtol=2e-3, atol=2e-3)


def test_float16_grid_sampling_through_the_cpu_runs_where_the_cpu_has_no_float16(
    dev: torch.device,
) -> None:
    """Bicubic sampling goes through the CPU (vision.sampling): torch 2.4's CPU has no float16
    grid sampler, so there it computes in float32; 2.14's runs its own."""
    torch.manual_seed(0)
    image, grid = torch.randn(1, 2, 6, 6).half(), (torch.rand(1, 4, 4, 2) * 2 - 1).half()
    try:
        expected = F.grid_sample(image, grid, mode="bicubic", align_corners=False)
    except RuntimeError:  # no float16 kernel on this torch's CPU
        expected = F.grid_sample(image.float(), grid.float(), mode="bicubic", align_corners=False)
        expected = expected.half()
    leaf = image.to(dev).requires_grad_()
    out = F.grid_sample(leaf, grid.to(dev), mode="bicubic", align_corners=False)
    out.float().sum().backward()
    assert out.dtype == torch.float16 and torch.equal(out.detach().cpu(), expected)
    assert leaf.grad is not None and leaf.grad.dtype == torch.float16
