"""torchvision's ``nms`` and ``roi_align`` on the device: torchvision has CPU and CUDA kernels
only, so without dmlpatch every call goes through DirectML's CPU fallback (Faster R-CNN: 54
copies a training step). With it, both run on the device equal to the CPU, forward and
backward, with no copy."""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from tests.e2e.opfix.helpers import close, without_fixes
from torchvision.ops import (
    batched_nms,
    deform_conv2d,
    nms,
    ps_roi_align,
    ps_roi_pool,
    roi_align,
    roi_pool,
)

import dmlpatch.sim as sim
from dmlpatch.opfix.vision import detection_costs

# What these tests check is the compositions: the cost model would send some of these small
# calls through the fallback (test_opfix_fix_costs checks the choice).
pytestmark = pytest.mark.usefixtures("composed")


def _boxes(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(count, 2, generator=generator) * 100
    boxes = torch.cat((corners, corners + torch.rand(count, 2, generator=generator) * 40 + 1), 1)
    # Rounded scores: ties, as an untrained detector's are.
    scores = (torch.rand(count, generator=generator) * 20).round() / 20
    return boxes, scores


def test_without_dmlpatch_both_fall_back(dev: torch.device) -> None:
    boxes, scores = _boxes(50, 0)
    features = torch.randn(1, 4, 16, 16, device=dev)
    rois = torch.tensor([[0.0, 1, 1, 9, 9]], device=dev)
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        nms(boxes.to(dev), scores.to(dev), 0.5)
        roi_align(features, rois, (2, 2), 1.0, 2, True)
        fallbacks = sim.counters()["ops"]["fallback"]
    assert {"torchvision::nms", "torchvision::roi_align"} <= set(fallbacks)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("count", [0, 1, 40, 300])
def test_nms_keeps_torchvisions_boxes_in_its_order(
    dev: torch.device, count: int, threshold: float
) -> None:
    boxes, scores = _boxes(count, count)
    expected = nms(boxes, scores, threshold)
    on_device_boxes, on_device_scores = boxes.to(dev), scores.to(dev)
    sim.reset_counters()
    kept = nms(on_device_boxes, on_device_scores, threshold)
    counters = sim.counters()
    assert kept.device == dev and torch.equal(kept.cpu(), expected)
    assert counters["ops"]["fallback"] == {}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nms_of_half_precision_boxes_is_the_float32_answer(
    dev: torch.device, dtype: torch.dtype
) -> None:
    """torchvision's test_nms_float16: boxes a thousand pixels wide, whose areas overflow
    float16; torchvision's CUDA kernel computes their IoU in float32 (its CPU kernel has no
    float16)."""
    boxes = torch.tensor(
        [
            [285.3538, 185.5758, 1193.5110, 851.4551],
            [285.1472, 188.7374, 1192.4984, 851.0669],
            [279.2440, 197.9812, 1189.4746, 849.2019],
        ]
    )
    scores = torch.tensor([0.6370, 0.7569, 0.3966])
    expected = nms(boxes, scores, 0.2)
    kept = nms(boxes.to(dev, dtype), scores.to(dev, dtype), 0.2)
    assert torch.equal(kept.cpu(), expected) and expected.tolist() == [1]


def test_nms_of_float16_boxes_through_the_cpu(
    dev: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost model sends a few boxes through the CPU, whose kernel has no float16
    (torchvision's test_nms_float16 stopped there): they go in float32, as CUDA computes them."""
    from dmlpatch.opfix.vision import detection

    monkeypatch.setattr(detection._NMS, "on_device", lambda key, costs: False)
    boxes = torch.tensor([[285.35, 185.58, 1193.51, 851.46], [285.15, 188.74, 1192.50, 851.07]])
    scores = torch.tensor([0.6370, 0.7569])
    sim.reset_counters()
    kept = nms(boxes.to(dev, torch.float16), scores.to(dev, torch.float16), 0.2)
    assert torch.equal(kept.cpu(), nms(boxes, scores, 0.2))
    assert set(sim.counters()["ops"]["fallback"]) == {"torchvision::nms"}


@pytest.mark.parametrize("kept", [True, False])
def test_nms_row_blocks_agree(
    dev: torch.device, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    boxes, scores = _boxes(300, 7)
    monkeypatch.setattr(detection_costs, "BLOCK", 7)  # many row blocks, one partial
    if not kept:  # the overlap matrix computed anew in each round, as for many boxes
        monkeypatch.setattr(detection_costs, "WHOLE_MATRIX", 0)
    assert torch.equal(nms(boxes.to(dev), scores.to(dev), 0.4).cpu(), nms(boxes, scores, 0.4))


@pytest.mark.parametrize("strategy", ["coordinate trick", "per class"])
def test_batched_nms_both_strategies(dev: torch.device, strategy: str) -> None:
    boxes, scores = _boxes(120, 3)
    classes = torch.arange(120) % 4
    if strategy == "per class":
        # What batched_nms runs for large inputs (4000 coordinates on the CPU): nms per class.
        boxes_module = torchvision.ops.boxes
        expected = boxes_module._batched_nms_vanilla(boxes, scores, classes, 0.5)
        got = boxes_module._batched_nms_vanilla(boxes.to(dev), scores.to(dev), classes.to(dev), 0.5)
    else:
        expected = batched_nms(boxes, scores, classes, 0.5)
        got = batched_nms(boxes.to(dev), scores.to(dev), classes.to(dev), 0.5)
    assert torch.equal(got.cpu(), expected)


ROIS = torch.tensor(
    [
        [0, 1.5, 2.0, 15.0, 18.0],
        [1, 0.0, 0.0, 23.0, 19.0],
        [0, -3.0, 4.0, 8.0, 30.0],  # partly outside the map
        [1, 5.2, 5.1, 5.3, 5.4],  # smaller than a bin
        [0, 10, 10, 60, 50],  # larger than the map
        [1, 22.9, 18.9, 40.0, 40.0],  # starts at the last row and column
    ]
)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
def test_roi_align_forward_and_backward_equal_the_cpu(
    dev: torch.device, aligned: bool, sampling_ratio: int, scale: float
) -> None:
    torch.manual_seed(0)
    features = torch.randn(2, 5, 20, 24)
    expected_input = features.clone().requires_grad_()
    expected = roi_align(expected_input, ROIS, (7, 5), scale, sampling_ratio, aligned)
    upstream = torch.randn_like(expected)
    expected.backward(upstream)
    on_device = features.to(dev).requires_grad_()
    rois, gradient = ROIS.to(dev), upstream.to(dev)
    sim.reset_counters()
    got = roi_align(on_device, rois, (7, 5), scale, sampling_ratio, aligned)
    got.backward(gradient)
    counters = sim.counters()
    assert close(got.detach(), expected.detach())
    assert on_device.grad is not None and expected_input.grad is not None
    assert close(on_device.grad, expected_input.grad)
    assert counters["ops"]["fallback"] == {}
    assert "torchvision::_roi_align_backward" not in counters["ops"].get("fixed", {})


def test_roi_align_without_regions_and_in_chunks(
    dev: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    features = torch.randn(2, 3, 9, 9)
    empty = roi_align(features.to(dev), torch.zeros(0, 5, device=dev), (2, 2), 1.0, 2, False)
    assert empty.shape == (0, 3, 2, 2)
    monkeypatch.setattr(detection_costs, "CHUNK_ELEMENTS", 1)  # one region per chunk
    expected = roi_align(features, ROIS, (3, 3), 0.3, 0, True)
    assert close(roi_align(features.to(dev), ROIS.to(dev), (3, 3), 0.3, 0, True), expected)


def test_a_detection_step_makes_no_copy(dev: torch.device) -> None:
    """Faster R-CNN's RPN and box head, one training step and one inference, on the device:
    every nms and roi_align (and its backward) served there."""
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).to(dev)
    images = [torch.rand(3, 128, 160, device=dev)]
    targets = [
        {
            "boxes": torch.tensor([[10.0, 20, 80, 90]], device=dev),
            "labels": torch.tensor([1], device=dev),
        }
    ]
    sim.reset_counters()
    losses = model(images, targets)
    sum(losses.values()).backward()
    model.eval()
    with torch.no_grad():
        model(images)
    ops = sim.counters()["ops"]
    assert not any(name.startswith("torchvision::") for name in ops["fallback"]), ops["fallback"]
    assert {"torchvision::nms", "torchvision::roi_align"} <= set(ops["fixed"])


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
def test_roi_pool_maxima_places_and_gradients_equal_the_cpu(
    dev: torch.device, scale: float
) -> None:
    torch.manual_seed(0)
    features = torch.randn(2, 5, 20, 24).round(decimals=1)  # ties: the first maximum counts
    rois = torch.cat((ROIS, torch.tensor([[0, 2.5, 3.5, 2.5, 3.5]])))  # halves round away
    expected_values, expected_places = torch.ops.torchvision.roi_pool(features, rois, scale, 7, 5)
    expected_input = features.clone().requires_grad_()
    expected = roi_pool(expected_input, rois, (7, 5), scale)
    upstream = torch.randn_like(expected)
    expected.backward(upstream)
    on_device = features.to(dev).requires_grad_()
    sim.reset_counters()
    values, places = torch.ops.torchvision.roi_pool(features.to(dev), rois.to(dev), scale, 7, 5)
    roi_pool(on_device, rois.to(dev), (7, 5), scale).backward(upstream.to(dev))
    counters = sim.counters()
    assert torch.equal(values.cpu(), expected_values)
    assert places.dtype == expected_places.dtype and torch.equal(places.cpu(), expected_places)
    assert on_device.grad is not None and expected_input.grad is not None
    assert torch.equal(on_device.grad.cpu(), expected_input.grad)
    assert counters["ops"]["fallback"] == {}
    assert {"torchvision::roi_pool", "torchvision::_roi_pool_backward"} <= set(
        counters["ops"]["fixed"]
    )


@pytest.mark.parametrize("sampling_ratio", [-1, 0, 2])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_ps_roi_align_forward_backward_and_mapping_equal_the_cpu(
    dev: torch.device, sampling_ratio: int, scale: float
) -> None:
    torch.manual_seed(0)
    features = torch.randn(2, 2 * 3 * 4, 20, 24)  # 2 output channels of 3x4 bins
    expected_input = features.clone().requires_grad_()
    expected = ps_roi_align(expected_input, ROIS, (3, 4), scale, sampling_ratio)
    upstream = torch.randn_like(expected)
    expected.backward(upstream)
    _, expected_mapping = torch.ops.torchvision.ps_roi_align(
        features, ROIS, scale, 3, 4, sampling_ratio
    )
    on_device = features.to(dev).requires_grad_()
    sim.reset_counters()
    got = ps_roi_align(on_device, ROIS.to(dev), (3, 4), scale, sampling_ratio)
    got.backward(upstream.to(dev))
    _, mapping = torch.ops.torchvision.ps_roi_align(
        features.to(dev), ROIS.to(dev), scale, 3, 4, sampling_ratio
    )
    counters = sim.counters()
    assert close(got.detach(), expected.detach())
    assert on_device.grad is not None and expected_input.grad is not None
    assert close(on_device.grad, expected_input.grad)
    assert mapping.dtype == expected_mapping.dtype
    assert torch.equal(mapping.cpu(), expected_mapping)
    assert counters["ops"]["fallback"] == {}


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
def test_ps_roi_pool_means_gradients_and_mapping_equal_the_cpu(
    dev: torch.device, scale: float
) -> None:
    torch.manual_seed(0)
    features = torch.randn(2, 2 * 3 * 4, 20, 24)
    rois = torch.cat((ROIS, torch.tensor([[0, 2.5, 3.5, 2.5, 3.5]])))
    expected_input = features.clone().requires_grad_()
    expected = ps_roi_pool(expected_input, rois, (3, 4), scale)
    upstream = torch.randn_like(expected)
    expected.backward(upstream)
    _, expected_mapping = torch.ops.torchvision.ps_roi_pool(features, rois, scale, 3, 4)
    on_device = features.to(dev).requires_grad_()
    sim.reset_counters()
    got = ps_roi_pool(on_device, rois.to(dev), (3, 4), scale)
    got.backward(upstream.to(dev))
    _, mapping = torch.ops.torchvision.ps_roi_pool(features.to(dev), rois.to(dev), scale, 3, 4)
    counters = sim.counters()
    assert close(got.detach(), expected.detach())
    assert on_device.grad is not None and expected_input.grad is not None
    # torchvision's backward windows reach the last row and column where its forward's stop
    # short: the gradient is torchvision's, not the forward's exact adjoint.
    assert close(on_device.grad, expected_input.grad)
    assert torch.equal(mapping.cpu(), expected_mapping)
    assert counters["ops"]["fallback"] == {}
    assert {"torchvision::ps_roi_pool", "torchvision::_ps_roi_pool_backward"} <= set(
        counters["ops"]["fixed"]
    )


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups", "offset_groups", "use_mask"),
    [
        (1, 0, 1, 1, 1, False),
        (1, 1, 1, 1, 1, True),  # DCNv2: modulated
        (2, 1, 2, 2, 2, True),
        (1, 2, 1, 1, 2, False),
    ],
)
def test_deform_conv2d_and_every_gradient_equal_the_cpu(
    dev: torch.device,
    stride: int,
    padding: int,
    dilation: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> None:
    torch.manual_seed(0)
    batch, channels, height, width, out_channels, kernel = 2, 4, 9, 10, 6, 3
    span = dilation * (kernel - 1) + 1
    out_h = (height + 2 * padding - span) // stride + 1
    out_w = (width + 2 * padding - span) // stride + 1
    taps = offset_groups * kernel * kernel
    leaves = {
        "input": torch.randn(batch, channels, height, width),
        "offset": torch.randn(batch, 2 * taps, out_h, out_w) * 2,  # reaching past the border
        "weight": torch.randn(out_channels, channels // groups, kernel, kernel),
        "bias": torch.randn(out_channels),
    }
    if use_mask:
        leaves["mask"] = torch.rand(batch, taps, out_h, out_w)

    def run(on: dict[str, torch.Tensor]) -> torch.Tensor:
        return deform_conv2d(
            on["input"], on["offset"], on["weight"], on["bias"], stride=stride,
            padding=padding, dilation=dilation, mask=on.get("mask"),
        )  # fmt: skip

    expected_leaves = {name: value.clone().requires_grad_() for name, value in leaves.items()}
    expected = run(expected_leaves)
    upstream = torch.randn_like(expected)
    expected.backward(upstream)
    device_leaves = {name: value.to(dev).requires_grad_() for name, value in leaves.items()}
    sim.reset_counters()
    got = run(device_leaves)
    got.backward(upstream.to(dev))
    counters = sim.counters()
    assert close(got.detach(), expected.detach())
    for name, leaf in device_leaves.items():
        assert leaf.grad is not None and expected_leaves[name].grad is not None
        assert close(leaf.grad, expected_leaves[name].grad), name
    assert counters["ops"]["fallback"] == {}
    assert "torchvision::deform_conv2d" in counters["ops"]["fixed"]
