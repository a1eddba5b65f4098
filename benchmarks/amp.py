"""Mixed precision on the simulated DirectML device: memory and modelled time, float32 vs AMP.

    .venv/bin/python benchmarks/amp.py [--steps N] [--only NAME ...] [--threads N]

Three training steps (a small CNN, a transformer encoder, a diffusers UNet; real architectures,
random init), each run in a fresh process in two modes on the simulated device with dmlpatch's
fixes installed:

- ``float32``: the step as written;
- ``amp``: the same step under ``torch.autocast("privateuseone")`` (float16, CUDA's lists) with a
  ``torch.amp.GradScaler`` on the device, as a CUDA AMP program runs under dmlpatch.

For each it prints, side by side:

- the device memory the step adds above what is held before it (weights, gradients, optimizer
  state), at its peak: the simulated allocator's true peak (``torch.cuda.max_memory_allocated``
  under the runner), reset before the measured step; AMP's activations are float16, so this
  share should come near half;
- the modelled DirectML time per step on two shipped adapter profiles (the cost model prices
  float16 kernels at the adapter's float16 rate and their bytes at half the width);
- the simulator's wall time (the CPU's kernels; its float16 matrix products and convolutions
  compute in float32: not a GPU's).

It also times the autocast kernels' own cost per call on this machine: a call whose inputs are
already float16 (no cast to make) inside a region, against the same call outside one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != REPO / "benchmarks"]
MODES = ("float32", "amp")
PRICED = ("rdna2-desktop", "intel-igpu")

Step = Callable[[Any, Any, bool], None]


def small_cnn(device: Any) -> Callable[[bool, Any], None]:
    """A VGG-like CNN on 16x3x64x64 images, SGD with momentum."""
    import torch
    from torch import nn

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(
        *block(3, 32), *block(32, 32), nn.MaxPool2d(2),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(16, 3, 64, 64)
    y = torch.randint(0, 10, (16,))

    def step(amp: bool, scaler: Any) -> None:
        optimizer.zero_grad()
        with torch.autocast("privateuseone", enabled=amp):
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        _backward_and_step(loss, optimizer, scaler)

    return step


def transformer(device: Any) -> Callable[[bool, Any], None]:
    """A 4-layer transformer encoder (width 256, 8 heads) on 8x128 tokens, AdamW."""
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(256, 8, dim_feedforward=1024, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    model = nn.ModuleDict(
        {"embed": nn.Embedding(1000, 256), "encoder": encoder, "head": nn.Linear(256, 1000)}
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 1000, (8, 128))

    def step(amp: bool, scaler: Any) -> None:
        ids = tokens.to(device)
        optimizer.zero_grad()
        with torch.autocast("privateuseone", enabled=amp):
            hidden = model["encoder"](model["embed"](ids))
            logits = model["head"](hidden)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        _backward_and_step(loss, optimizer, scaler)

    return step


def unet(device: Any) -> Callable[[bool, Any], None]:
    """A diffusers UNet2DModel (32/64/64 channels, 32x32 images, batch 8) learning to predict
    noise, AdamW."""
    import torch
    from diffusers import UNet2DModel

    model = UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(8, 3, 32, 32)
    noise = torch.randn(8, 3, 32, 32)
    timesteps = torch.randint(0, 1000, (8,))

    def step(amp: bool, scaler: Any) -> None:
        optimizer.zero_grad()
        with torch.autocast("privateuseone", enabled=amp):
            predicted = model(images.to(device) + noise.to(device), timesteps.to(device)).sample
            loss = torch.nn.functional.mse_loss(predicted.float(), noise.to(device))
        _backward_and_step(loss, optimizer, scaler)

    return step


def _backward_and_step(loss: Any, optimizer: Any, scaler: Any) -> None:
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


WORKLOADS = {"cnn": small_cnn, "transformer": transformer, "unet": unet}


def one(name: str, mode: str, steps: int, out: Path) -> None:
    """Run one (workload, mode) in this process and write its figures to ``out``."""
    import torch

    import dmlpatch.sim as sim
    from dmlpatch import opfix
    from dmlpatch.costs import profiles, simulated

    sim.load("torch-directml-0.2.5")
    opfix.install("sim", "torch-directml-0.2.5")
    device = sim.device(0)
    torch.manual_seed(0)
    step = WORKLOADS[name](device)
    amp = mode == "amp"
    scaler = torch.amp.GradScaler("privateuseone") if amp else None
    step(amp, scaler)  # warm-up: optimizer state, the scaler's tensors, cached choices
    held, peaks, walls = [], [], []
    priced: dict[str, list[float]] = {profile: [] for profile in PRICED}
    for _ in range(steps):
        sim.reset_peak_memory(0)
        held.append(sim.memory_allocated(0))
        sim.reset_counters()
        started = time.perf_counter()
        step(amp, scaler)
        walls.append(time.perf_counter() - started)
        for profile in PRICED:
            priced[profile].append(simulated.priced(profiles.SHIPPED[profile]).total)
        peaks.append(sim.max_memory_allocated(0))
    result = {
        "held": statistics.median(held),
        "peak": statistics.median(peaks),
        "added": statistics.median(p - h for p, h in zip(peaks, held)),
        "wall_s": statistics.median(walls),
        "priced": {profile: statistics.median(values) for profile, values in priced.items()},
    }
    out.write_text(json.dumps(result), encoding="utf-8")


def per_call_cost() -> dict[str, float]:
    """The autocast kernels' own time per call (µs): ``x @ x`` of float16 inputs (nothing to
    cast) inside a region against outside one; a float32 ``nn.Linear`` given float16 input in a
    region (its weights' casts cached) against a float16 one outside; and ``relu``, which
    autocast does not list, inside and outside."""
    import torch

    import dmlpatch.sim as sim
    from dmlpatch import opfix

    sim.load("torch-directml-0.2.5")
    opfix.install("sim", "torch-directml-0.2.5")
    device = sim.device(0)
    x = torch.randn(2, 2, device=device, dtype=torch.float16)
    layer = torch.nn.Linear(2, 2).to(device)

    def timed(call: Callable[[], Any], region: bool, n: int = 3000) -> float:
        best = float("inf")
        for _ in range(5):
            with torch.autocast("privateuseone", enabled=region):
                call()
                started = time.perf_counter()
                for _ in range(n):
                    call()
                best = min(best, (time.perf_counter() - started) / n)
        return best * 1e6

    half_layer = torch.nn.Linear(2, 2).to(device).half()
    figures = {}
    for label, plain, in_region in (
        ("mm, float16 inputs", lambda: x @ x, lambda: x @ x),
        # outside: a float16 layer; inside: the float32 layer, its casts cached
        ("linear, cached weights", lambda: half_layer(x), lambda: layer(x)),
        ("relu (not listed)", lambda: torch.relu(x), lambda: torch.relu(x)),
    ):
        outside, inside = timed(plain, False), timed(in_region, True)
        figures[label] = {"outside_us": outside, "inside_us": inside}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps (default 3)")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS), help="workload")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of each process")
    parser.add_argument("--one", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--per-call", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        one(options.one, options.mode, options.steps, options.out)
        return
    if options.per_call:
        options.per_call.write_text(json.dumps(per_call_cost()), encoding="utf-8")
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLPATCH_")}
    env.update(
        PYTHONPATH=str(REPO / "src"),
        OMP_NUM_THREADS=str(options.threads),
        MKL_NUM_THREADS=str(options.threads),
        HF_HUB_OFFLINE="1",
    )
    if "DMLPATCH_CACHE_DIR" in os.environ:
        env["DMLPATCH_CACHE_DIR"] = os.environ["DMLPATCH_CACHE_DIR"]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dmlpatch-bench-amp-") as directory:
        root = Path(directory)
        for name in options.only or WORKLOADS:
            results[name] = {}
            for mode in MODES:
                out = root / f"{name}.{mode}.json"
                command = [sys.executable, __file__, "--one", name, "--mode", mode]
                command += ["--out", str(out), "--steps", str(options.steps)]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                if done.returncode != 0 or not out.exists():
                    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                    results[name][mode] = {"error": tail}
                    continue
                results[name][mode] = json.loads(out.read_text(encoding="utf-8"))
        per_call_file = root / "per_call.json"
        subprocess.run(
            [sys.executable, __file__, "--per-call", str(per_call_file)], env=env, check=True
        )
        per_call = json.loads(per_call_file.read_text(encoding="utf-8"))
    mib = 2**20
    print("peak device memory a training step adds (MiB), and modelled DirectML ms per step")
    header = f"{'workload':<12}{'held f32':>10}{'step f32':>10}{'step amp':>10}{'amp/f32':>9}"
    for profile in PRICED:
        header += f"{profile + ' f32':>20}{'amp':>8}{'amp/f32':>9}"
    print(header + f"{'sim wall ms f32 / amp':>24}")
    for name, modes in results.items():
        f32, amp = modes["float32"], modes["amp"]
        if "error" in f32 or "error" in amp:
            print(f"{name:<12}failed: {f32.get('error') or amp.get('error')}")
            continue
        row = (
            f"{name:<12}{f32['held'] / mib:>10.2f}{f32['added'] / mib:>10.2f}"
            f"{amp['added'] / mib:>10.2f}{amp['added'] / f32['added']:>9.2f}"
        )
        for profile in PRICED:
            mine, theirs = amp["priced"][profile], f32["priced"][profile]
            row += f"{theirs * 1e3:>20.3f}{mine * 1e3:>8.3f}{mine / theirs:>9.2f}"
        walls = f"{f32['wall_s'] * 1e3:.0f} / {amp['wall_s'] * 1e3:.0f}"
        print(row + f"{walls:>24}")
    print("\nautocast kernels' own cost on this machine (µs per call, outside / inside a region)")
    for label, figures in per_call.items():
        outside, inside = figures["outside_us"], figures["inside_us"]
        print(f"  {label:<26}{outside:>8.2f} / {inside:>8.2f}   (+{inside - outside:.2f})")


if __name__ == "__main__":
    main()
