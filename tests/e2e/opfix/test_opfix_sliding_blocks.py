"""``F.unfold``/``F.fold`` (``aten::im2col``/``aten::col2im``) on the device: torch-directml has
neither, so without dmlpatch each call (and its gradient, the other one) copies through the
CPU. With it, both run on the device equal to the CPU, forward and backward, batched or not,
with PyTorch's own errors for impossible shapes."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from tests.e2e.opfix.helpers import close, without_fixes

import dmlpatch.sim as sim

# What these tests check is the compositions: the cost model would send some of these small
# calls through the fallback (test_opfix_fix_costs checks the choice).
pytestmark = pytest.mark.usefixtures("composed")

CASES = [
    case
    for case in itertools.product(
        [(2, 3), (1, 5), (3, 3), (4, 4)],  # kernel
        [(1, 1), (2, 1)],  # dilation
        [(0, 0), (1, 2)],  # padding
        [(1, 1), (2, 3), (4, 4)],  # stride
    )
    # Kernels that do not fit a 9x11 image: the CPU refuses them (see the error test).
    if all(
        size + 2 * p - (d * (k - 1) + 1) >= 0
        for size, k, d, p in zip((9, 11), case[0], case[1], case[2])
    )
]


def test_without_dmlpatch_both_fall_back(dev: torch.device) -> None:
    x = torch.randn(1, 2, 6, 6, device=dev, requires_grad=True)
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        F.fold(F.unfold(x, 3), (6, 6), 3).sum().backward()
        fallbacks = sim.counters()["ops"]["fallback"]
    assert {"aten::im2col", "aten::col2im"} <= set(fallbacks)


@pytest.mark.parametrize(("kernel", "dilation", "padding", "stride"), CASES)
def test_unfold_and_fold_forward_and_backward_equal_the_cpu(
    dev: torch.device,
    kernel: tuple[int, int],
    dilation: tuple[int, int],
    padding: tuple[int, int],
    stride: tuple[int, int],
) -> None:
    torch.manual_seed(0)
    image = torch.randn(2, 3, 9, 11, requires_grad=True)
    blocks = F.unfold(image, kernel, dilation, padding, stride)
    upstream = torch.randn_like(blocks)
    blocks.backward(upstream)
    columns = torch.randn(blocks.shape, requires_grad=True)
    folded = F.fold(columns, (9, 11), kernel, dilation, padding, stride)
    folded_upstream = torch.randn_like(folded)
    folded.backward(folded_upstream)

    on_device = image.detach().to(dev).requires_grad_()
    columns_on_device = columns.detach().to(dev).requires_grad_()
    sim.reset_counters()
    got = F.unfold(on_device, kernel, dilation, padding, stride)
    got.backward(upstream.to(dev))
    got_folded = F.fold(columns_on_device, (9, 11), kernel, dilation, padding, stride)
    got_folded.backward(folded_upstream.to(dev))
    ops = sim.counters()["ops"]
    assert close(got.detach(), blocks.detach()) and close(got_folded.detach(), folded.detach())
    assert on_device.grad is not None and image.grad is not None
    assert columns_on_device.grad is not None and columns.grad is not None
    assert close(on_device.grad, image.grad) and close(columns_on_device.grad, columns.grad)
    assert ops["fallback"] == {}
    assert ops["fixed"]["aten::im2col"] == 2 and ops["fixed"]["aten::col2im"] == 2


def test_unbatched_inputs_and_the_modules(dev: torch.device) -> None:
    image = torch.randn(3, 8, 8)
    unfold, fold = torch.nn.Unfold(2, stride=2), torch.nn.Fold((8, 8), 2, stride=2)
    assert close(unfold(image.to(dev)), unfold(image))
    assert close(fold(unfold(image.to(dev))), fold(unfold(image)))


def test_a_long_kernel_overlap_add_as_vocos_istft_head(dev: torch.device) -> None:
    # Vocos overlaps its inverse-FFT frames with fold: kernel (1, 1024), hop 256.
    frames = torch.randn(2, 1024, 40)
    size = (1, 256 * 39 + 1024)
    expected = F.fold(frames, size, (1, 1024), stride=(1, 256))
    sim.reset_counters()
    got = F.fold(frames.to(dev), size, (1, 1024), stride=(1, 256))
    assert close(got, expected) and sim.counters()["ops"]["fallback"] == {}


@pytest.mark.parametrize(
    ("call", "args"),
    [
        (F.unfold, ((1, 2, 3, 3), 5)),
        (F.fold, ((1, 8, 15), (5, 5), 2)),
        (F.fold, ((1, 7, 16), (5, 5), 2)),
    ],
)
def test_impossible_shapes_fail_with_the_cpu_s_words(
    dev: torch.device, call: object, args: tuple[object, ...]
) -> None:
    shape, *rest = args
    assert callable(call)
    with pytest.raises(RuntimeError) as on_cpu:
        call(torch.randn(shape), *rest)
    with pytest.raises(RuntimeError) as on_device:
        call(torch.randn(shape, device=dev), *rest)
    assert str(on_device.value) == str(on_cpu.value)
