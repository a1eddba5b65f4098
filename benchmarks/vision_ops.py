"""torchvision's detection operators on the simulated device: dmlpatch's compositions against
DirectML's CPU fallback they replace and against the kernel itself, per call and per training
step of Faster R-CNN (mobilenet_v3 FPN, 320 px, batch 2), measured side by side in one run.

    python benchmarks/vision_ops.py [--repeat N] [--steps N]

The simulated device runs CPU kernels, so "kernel" (torchvision's CPU kernel on the same data,
what a native DirectML kernel would be to the simulator) and the fallback (the same kernel
behind two copies) differ by the copies alone; on a GPU the fallback also waits for the queue
to drain before each copy out. The copies and bytes per call come from the simulator's
counters: they are what the fallback would move over PCIe on a real adapter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from typing import Any, Callable

import torch
import torchvision
from torchvision.ops import nms, roi_align

import dmlpatch.sim as sim
from dmlpatch import opfix
from dmlpatch.environment_variables import DMLPATCH_DEVICE_OPS

PROFILE = "torch-directml-0.2.5"


def _time(call: Callable[[], Any], repeat: int) -> float:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _copies(call: Callable[[], Any]) -> tuple[int, int]:
    """Copies between host and device of one call: transfers, and the fallbacks' own."""
    sim.reset_counters()
    call()
    counters = sim.counters()
    entries = [*counters["transfers"].values(), *counters["copies"].values()]
    return sum(e["count"] for e in entries), sum(e["bytes"] for e in entries)


def _cases(dev: torch.device) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(2000, 2, generator=generator) * 300
    boxes = torch.cat((corners, corners + torch.rand(2000, 2, generator=generator) * 60 + 1), 1)
    scores = torch.rand(2000, generator=generator)
    features = torch.randn(2, 64, 40, 40, generator=generator)
    rois = torch.cat(
        (torch.randint(0, 2, (256, 1), generator=generator).float(), boxes[:256] / 2), 1
    )
    on = {"boxes": boxes.to(dev), "scores": scores.to(dev)}
    grad_features = features.to(dev).requires_grad_()
    cpu_features = features.clone().requires_grad_()

    def align(x: torch.Tensor, r: torch.Tensor) -> Callable[[], Any]:
        def run() -> None:
            roi_align(x, r, (7, 7), 0.25, 2, True).sum().backward()

        return run

    return {
        "nms, 2000 boxes": (
            lambda: nms(on["boxes"], on["scores"], 0.5),
            lambda: nms(boxes, scores, 0.5),
        ),
        "roi_align fwd+bwd, 256 regions": (
            align(grad_features, rois.to(dev)),
            align(cpu_features, rois),
        ),
    }


def _detection_step(dev: torch.device) -> Callable[[], Any]:
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5
    ).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images = [torch.rand(3, 240, 320, device=dev) for _ in range(2)]
    boxes = torch.tensor([[10.0, 20, 80, 90], [50, 60, 150, 140]], device=dev)
    targets = [{"boxes": boxes, "labels": torch.tensor([1, 3], device=dev)} for _ in range(2)]

    def step() -> None:
        losses = model(images, targets)
        optimizer.zero_grad()
        sum(losses.values()).backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    options = parser.parse_args()
    # The device's column is the composition's, whatever the cost model would pick per call.
    os.environ.setdefault(DMLPATCH_DEVICE_OPS, "all")
    sim.load(PROFILE)
    opfix.install("sim", PROFILE)
    dev = torch.device("privateuseone:0")
    warnings.simplefilter("ignore")  # DirectML's fallback warning, once per operator
    print("per call (median us): fixed on the device / CPU fallback / the kernel; copies")
    for name, (on_device, kernel) in _cases(dev).items():
        fixed = _time(on_device, options.repeat)
        fixed_copies = _copies(on_device)
        opfix.uninstall()
        fallback = _time(on_device, options.repeat)
        fallback_copies = _copies(on_device)
        opfix.install("sim", PROFILE)
        native = _time(kernel, options.repeat)
        print(
            f"  {name:32} {fixed:9.0f} / {fallback:9.0f} / {native:9.0f}   "
            f"fixed {fixed_copies[0]} copies ({fixed_copies[1]} B), "
            f"fallback {fallback_copies[0]} copies ({fallback_copies[1]} B)"
        )
    # Each variant trains a model of its own from the same seed, rounds alternating.
    steps = {"fixed": _detection_step(dev)}
    opfix.uninstall()
    steps["fallback"] = _detection_step(dev)
    opfix.install("sim", PROFILE)
    times: dict[str, list[float]] = {"fixed": [], "fallback": []}
    copies: dict[str, tuple[int, int]] = {}
    for _ in range(options.steps):
        for label, step in steps.items():
            if label == "fallback":
                opfix.uninstall()
            times[label].append(_time(step, 1) / 1000)
            copies[label] = _copies(step)
            if label == "fallback":
                opfix.install("sim", PROFILE)
    fixed_ms, fallback_ms = (statistics.median(times[k]) for k in ("fixed", "fallback"))
    print(
        f"Faster R-CNN training step: fixed {fixed_ms:.0f} ms ({copies['fixed'][0]} copies, "
        f"{copies['fixed'][1] / 1e6:.1f} MB) / all fixes off {fallback_ms:.0f} ms "
        f"({copies['fallback'][0]} copies, {copies['fallback'][1] / 1e6:.1f} MB): "
        f"{fixed_ms / fallback_ms:.2f}x"
    )


if __name__ == "__main__":
    main()
