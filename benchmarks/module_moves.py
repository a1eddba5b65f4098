"""Cost of keeping parameters across module moves (:mod:`dmlpatch.opfix.module_moves`),
interleaved with the fix on and off in one process, medians of each:

- a move that did not need the fix (a CPU model's ``.half()``/``.float()``, which PyTorch already
  does in place);
- the move to the device itself (``.to(dev)`` of a fresh CPU model: the fix's handover against
  PyTorch's replacement);
- a training step on the device, before and after which nothing moves (the fix is not on it).

    python benchmarks/module_moves.py [--rounds N]

The model is a 24-layer MLP with LayerNorms (74 modules, 98 parameters): per-module costs show.
Each case is timed with the fix on and off back to back, in alternating order.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from torch import nn

import dmlpatch.sim as sim
from dmlpatch.opfix import module_moves

PROFILE = "torch-directml-0.2.5"


def _model() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(24):
        layers += [nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(64, 1))


def _time(call: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sim.load(PROFILE)
    dev = sim.device(0)

    cpu_model = _model()
    device_model = _model().to(dev)
    optimizer = torch.optim.SGD(device_model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64, device=dev), torch.randn(32, 1, device=dev)

    def cpu_dtype_round_trip() -> None:
        cpu_model.half()
        cpu_model.float()

    def move_to_device() -> None:
        _model().to(dev)

    def build_only() -> None:
        _model()

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.mse_loss(device_model(x), y).backward()
        optimizer.step()

    cases = {
        "CPU .half()+.float() (no fix needed)": (cpu_dtype_round_trip, 20),
        "build + .to(privateuseone:0)": (move_to_device, 10),
        "build only (subtracted from the move)": (build_only, 10),
        "training step on the device": (step, 20),
    }
    timings: dict[str, dict[bool, list[float]]] = {name: {True: [], False: []} for name in cases}
    for call, _repeat in cases.values():
        call()
    for round_ in range(args.rounds):
        for name, (call, repeat) in cases.items():
            for fixed in (True, False) if round_ % 2 else (False, True):
                if fixed:
                    module_moves.install()
                else:
                    module_moves.uninstall()
                timings[name][fixed].append(_time(call, repeat))
    module_moves.uninstall()

    parameters = sum(1 for _ in cpu_model.parameters())
    modules = sum(1 for _ in cpu_model.modules())
    print(f"{modules} modules, {parameters} parameters; medians of {args.rounds} rounds")
    print(f"{'':42} {'fix on':>10} {'fix off':>10} {'ratio':>7}")
    median = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in timings.items()}
    for name, by in median.items():
        on, off = by[True], by[False]
        print(f"{name:42} {on:8.0f}us {off:8.0f}us {on / off:6.2f}x")
    build = median["build only (subtracted from the move)"]
    move = median["build + .to(privateuseone:0)"]
    on, off = move[True] - build[True], move[False] - build[False]
    print(
        f"{'the move alone':42} {on:8.0f}us {off:8.0f}us {on / off:6.2f}x  "
        f"({(on - off) / parameters:+.1f} us per parameter)"
    )


if __name__ == "__main__":
    main()
