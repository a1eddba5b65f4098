"""Simulated DirectML device: per-op overhead and training-step cost against the CPU.

Run: ``python benchmarks/sim.py`` (``--no-build`` skips the cold-build measurement).
Targets: <= 2.5x CPU per training step, cold build <= 60 s, warm load <= 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

LOAD = (
    "import json, time; import torch; t = time.perf_counter(); import dmlpatch.sim as s; "
    "s.load(); print(json.dumps(time.perf_counter() - t))"
)


def _load_seconds(cache: str) -> float:
    env = dict(
        os.environ,
        DMLPATCH_CACHE_DIR=cache,
        PYTHONPATH=os.pathsep.join([*sys.path[:2], os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def _per_call(fn: Callable[[], object], repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t) / repeat)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-build", action="store_true", help="skip the cold build")
    parser.add_argument("--models-only", action="store_true", help="only the train-step table")
    args = parser.parse_args()

    if not args.no_build:
        with tempfile.TemporaryDirectory() as cache:
            cold = _load_seconds(cache)
            warm = min(_load_seconds(cache) for _ in range(3))
        print(
            f"build: cold build+load {cold:.1f} s (target <= 60 s), "
            f"warm load {warm * 1000:.0f} ms (target <= 500 ms)"
        )

    import torch
    from tests.e2e.sim.models import MODELS, make_input

    import dmlpatch.sim as sim

    torch.set_num_threads(max(1, torch.get_num_threads()))
    sim.load()
    dev = sim.device()
    if args.models_only:
        _train_steps(dev, MODELS, make_input)
        return

    small, big = torch.randn(64), torch.randn(256, 256)
    img, w = torch.randn(1, 8, 32, 32), torch.randn(8, 8, 3, 3)
    conv = torch.nn.functional.conv2d
    # name -> (function, its CPU arguments); arguments move to the device once, up front.
    ops: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
        "add (64)": (lambda a: a + a, (small,)),
        "mul_ in place (64)": (lambda a: a.mul_(1.0), (small,)),
        "view+t (64)": (lambda a: a.view(8, 8).t(), (small,)),
        "sum (256x256)": (lambda a: a.sum(), (big,)),
        "mm (256x256)": (lambda a: a @ a, (big,)),
        "relu (256x256)": (torch.relu, (big,)),
        "conv2d (8x32x32)": (lambda x, k: conv(x, k, padding=1), (img, w)),
        "lerp (fallback, 64)": (lambda a: torch.lerp(a, a, 0.5), (small,)),
    }
    print(f"\n{'op':24} {'cpu us':>9} {'sim us':>9} {'extra us':>9}")
    for name, (fn, cpu_args) in ops.items():
        dev_args = tuple(a.to(dev) for a in cpu_args)
        cpu = _per_call(lambda fn=fn, a=cpu_args: fn(*a), 2000) * 1e6
        got = _per_call(lambda fn=fn, a=dev_args: fn(*a), 2000) * 1e6
        print(f"{name:24} {cpu:9.2f} {got:9.2f} {got - cpu:9.2f}")

    _train_steps(dev, MODELS, make_input)
    # One thread from the start, in a fresh process: the autograd engine's device thread keeps
    # the OpenMP pool it started with, so switching threads mid-process measures two pools
    # fighting over two cores instead.
    subprocess.run(
        [sys.executable, __file__, "--no-build", "--models-only"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
    )


def _train_steps(dev: Any, models: Any, make_input: Callable[..., Any]) -> None:
    import torch

    threads = torch.get_num_threads()
    print(
        f"\n{'train step, ' + str(threads) + ' thread(s)':24} {'cpu ms':>9} {'sim ms':>9} "
        f"{'ratio':>9}   (target <= 2.5x)"
    )
    for name in ("cnn", "encoder", "unet"):
        cpu_ms, sim_ms = (
            _step_ms(models[name], make_input(name), d) for d in (torch.device("cpu"), dev)
        )
        print(f"{name:24} {cpu_ms:9.2f} {sim_ms:9.2f} {sim_ms / cpu_ms:8.2f}x")


def _step_ms(make_model: Callable[[], Any], x_cpu: Any, device: Any) -> float:
    import torch

    torch.manual_seed(0)
    model = make_model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = x_cpu.to(device)
    target = torch.arange(x.shape[0]).remainder(10).to(device)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), target).backward()
        opt.step()

    return _per_call(step, 20) * 1e3


if __name__ == "__main__":
    main()
