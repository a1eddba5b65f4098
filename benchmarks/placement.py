"""What compute-placement accounting costs a training step, measured side by side in one run.

    .venv/bin/python benchmarks/placement.py [--rounds N] [--steps N]

The runner keeps the accounting on by default (a global ``nn.Module`` forward hook, see
``dmlpatch.placement.module_hooks``). On the simulated DirectML device this times training
steps (forward, loss, backward, optimizer step) of:

- ultralytics' YOLOv8n detection model (``yolov8n.yaml``, random init) with its own detection
  loss, a batch of 4 at 64x64, as ``yolo train`` runs it in the tests;
- the CIFAR-style CNN of ``examples/train_cnn.py``, batch 32;

with the hook installed and removed, alternating each round so both see the same machine
noise, and prints the median of the per-round ratios (target <= 1.03x).

On this 2-core VM those ratios move by +-5% between runs, more than the cost itself, so it
also prints the cost built up from parts measured in tight loops: the module calls of one step
times what a global forward hook adds to each (``Module._call_impl``'s slow path), plus the
hook's own counting, replayed over the exact (layer, inputs, output) calls of one step.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent


def _steps(step: Callable[[], Any], count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        step()
    return time.perf_counter() - started


def yolo_step(device: Any) -> Callable[[], Any]:
    import torch

    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="dmlpatch-bench-yolo-"))
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).to(device)
    model.args = _yolo_args()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = {
        "img": torch.rand(4, 3, 64, 64, device=device),
        "cls": torch.tensor([[0.0], [1.0], [0.0], [1.0]], device=device),
        "bboxes": torch.tensor([[0.5, 0.5, 0.3, 0.3]] * 4, device=device),
        "batch_idx": torch.tensor([0.0, 1.0, 2.0, 3.0], device=device),
    }

    def step() -> None:
        loss, _ = model.loss(batch)
        optimizer.zero_grad()
        loss.sum().backward()
        optimizer.step()

    return step


def _yolo_args() -> Any:
    from ultralytics.cfg import get_cfg

    return get_cfg()


def cnn_step(device: Any) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F

    spec = importlib.util.spec_from_file_location("train_cnn", REPO / "examples" / "train_cnn.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(32, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (32,), device=device)

    def step() -> None:
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def measure(name: str, step: Callable[[], Any], rounds: int, steps: int) -> None:
    from dmlpatch.placement import ledger, module_hooks

    for _ in range(3):  # warm-up: allocator, first-call caches, lazily built kernels
        step()
    ratios, on_times, off_times = [], [], []
    for index in range(rounds):
        order = (True, False) if index % 2 == 0 else (False, True)
        timing = {}
        for hooked in order:
            if hooked:
                module_hooks.install()
            else:
                module_hooks.uninstall()
            timing[hooked] = _steps(step, steps)
        module_hooks.uninstall()
        ratios.append(timing[True] / timing[False])
        on_times.append(timing[True] / steps)
        off_times.append(timing[False] / steps)
    book = ledger.current()
    counted = book.totals("privateuseone") if book is not None else (0, 0)
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"{name:<28} off {statistics.median(off_times) * 1000:8.2f} ms/step   "
        f"on {statistics.median(on_times) * 1000:8.2f} ms/step   "
        f"ratio {statistics.median(ratios):.3f}x (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})"
        f"   layer calls counted per step on the device: {counted[0] // max(1, steps)}"
    )


def _median_pair(first: Callable[[], float], second: Callable[[], float], rounds: int) -> float:
    """Median over alternating rounds of ``first() - second()``."""
    differences = []
    for index in range(rounds):
        if index % 2:
            b, a = second(), first()
        else:
            a, b = first(), second()
        differences.append(a - b)
    return statistics.median(differences)


def by_parts(name: str, step: Callable[[], Any], device: Any, rounds: int) -> None:
    """The accounting's cost per step from its parts, each timed in a tight loop."""
    import torch
    from torch import nn
    from torch.nn.modules import module as torch_module

    from dmlpatch.placement import module_hooks

    calls: list[tuple[Any, Any, Any]] = []
    recorder = torch_module.register_module_forward_hook(
        lambda module, inputs, output: calls.append((module, inputs, output))
    )
    step()
    recorder.remove()
    chain = nn.Sequential(*[nn.Identity() for _ in range(1000)])
    probe = torch.zeros(1, device=device)

    def chain_seconds() -> float:
        started = time.perf_counter()
        for _ in range(20):
            chain(probe)
        return (time.perf_counter() - started) / 20000

    def hooked_chain() -> float:
        module_hooks.install()
        try:
            return chain_seconds()
        finally:
            module_hooks.uninstall()

    per_call = _median_pair(hooked_chain, chain_seconds, rounds)
    module_hooks.install()
    hook = next(iter(torch_module._global_forward_hooks.values()))
    started = time.perf_counter()
    for _ in range(20):
        for module, inputs, output in calls:
            hook(module, inputs, output)
    counting = (time.perf_counter() - started) / 20
    module_hooks.uninstall()
    step_seconds = statistics.median(_steps(step, 1) for _ in range(5))
    total = len(calls) * per_call + counting
    print(
        f"{name:<28} {len(calls)} module calls/step x {per_call * 1e6:.2f} us (hook's slow "
        f"path) + counting {counting * 1e3:.3f} ms = {total * 1e3:.3f} ms of "
        f"{step_seconds * 1e3:.1f} ms/step: {1 + total / step_seconds:.3f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5)
    options = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from dmlpatch.devices import resolution

    resolution.configure("sim")
    device = resolution.current().torch_device()
    print(f"accounting cost on {device} (median of {options.rounds} alternating rounds)")
    yolo, cnn = yolo_step(device), cnn_step(device)
    measure("YOLOv8n train step (b4 64px)", yolo, options.rounds, options.steps)
    measure("CIFAR CNN train step (b32)", cnn, options.rounds, options.steps * 4)
    print("the same cost built up from its parts")
    by_parts("YOLOv8n train step (b4 64px)", yolo, device, options.rounds)
    by_parts("CIFAR CNN train step (b32)", cnn, device, options.rounds)


if __name__ == "__main__":
    main()
