"""Cost of a model shared between processes (:mod:`dmlpatch.opfix.shared_modules`), in one
process, medians of interleaved rounds:

- a training step of mnist_hogwild's ``Net`` (batch 16) on the device, its weights on the
  device (unshared) against in host shared memory after ``model.share_memory()``: wall time,
  and the host<->device copies the simulated device counts per step;
- a module move nobody shares (a CPU model's ``.half()`` + ``.float()``) with the
  ``Module._apply`` wrapper installed against without it.

    python benchmarks/shared_modules.py [--rounds N]

The simulated device's kernels are the CPU's: the wall times compare code paths, and the
copies are what a DirectML adapter would pay (a read from the device waits for its queue).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import dmlpatch.sim as sim
from dmlpatch import opfix
from dmlpatch.opfix import shared_modules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e" / "multi"))
from hogwild_program import Net

PROFILE = "torch-directml-0.2.5"


def _time(call: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat * 1e3


def _step_of(dev: torch.device, share: bool) -> Callable[[], object]:
    torch.manual_seed(1)
    model = Net().to(dev)
    if share:
        model.share_memory()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    images = torch.randn(16, 1, 28, 28).to(dev)
    labels = torch.randint(0, 10, (16,)).to(dev)

    def step() -> object:
        optimizer.zero_grad()
        loss = F.nll_loss(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    sim.load(PROFILE)
    opfix.install("sim", PROFILE)
    dev = sim.device(0)

    steps = {"on the device": _step_of(dev, False), "shared": _step_of(dev, True)}
    for name, step in steps.items():
        step()
        sim.reset_counters()
        step()
        moved = sim.counters()["transfers"]
        print(
            f"{name}: per step {moved['h2d']['count']} copies to the device "
            f"({moved['h2d']['bytes']} B), {moved['d2h']['count']} from it "
            f"({moved['d2h']['bytes']} B)"
        )
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(_time(step, 10))
    for name, values in times.items():
        print(f"{name}: {statistics.median(values):.2f} ms per step")

    cpu_model = Net()

    def round_trip() -> None:
        cpu_model.half()
        cpu_model.float()

    moves: dict[str, list[float]] = {"wrapped": [], "plain": []}
    for index in range(args.rounds * 2):
        for wrapped in (True, False) if index % 2 else (False, True):
            if not wrapped:
                shared_modules.uninstall()
            moves["wrapped" if wrapped else "plain"].append(_time(round_trip, 50) * 1e3)
            if not wrapped:
                shared_modules.install()
    wrapped, plain = (statistics.median(moves[k]) for k in ("wrapped", "plain"))
    print(f"a move nobody shares: {wrapped:.1f} vs {plain:.1f} us ({wrapped / plain:.2f}x)")


if __name__ == "__main__":
    main()
