"""Whole programs on the simulated DirectML device, priced: dmlpatch vs torch-directml alone.

    .venv/bin/python benchmarks/workloads.py [--steps N] [--only NAME ...] [--json FILE]
                                             [--threads N]

Modelled DirectML time per step of a corpus of real workloads (real architectures, random
init, nothing downloaded), on every shipped adapter profile (:mod:`dmlpatch.costs.profiles`):
the simulated device counts each kernel's launch, bytes and FLOPs, the values the host waits
for, the bytes a CPU fallback copies each way and the CPU time of the fallback's kernel, and
:mod:`dmlpatch.costs.simulated` prices one run on all the profiles at once, split by cause
(launch, read-back, copy, compute, host). Two modes, each (workload, mode) in a fresh process:

- ``dmlpatch``: the simulated device with torch-directml 0.2.5's gaps and dmlpatch's operator
  fixes installed (``opfix.install("sim", "torch-directml-0.2.5")``): the compositions of
  native kernels, and the calls the fixes leave to the CPU, counted as DirectML's fallback;
- ``alone``: the same device without the fixes, what torch-directml 0.2.5 does by itself: every
  gap operator runs through the device's own CPU fallback (its copies, read-backs and CPU
  kernel, timed), and what DirectML refuses raises (the row says so and shows dmlpatch alone).

The models are built directly on ``privateuseone:0`` (no CUDA code to rewrite). Each process
runs one warm-up step, then prices each measured step on its own (the counters reset before
it, ``dmlpatch.sim.reset_counters()``) and reports the median step: a fallback's host time is
measured, and one step the machine's other work slowed would otherwise move the mean. Each
process uses one CPU thread (``--threads``): on a small shared machine, two OpenMP threads made
the same fallback's measured CPU time vary fourfold between runs. The wall time per step of the
simulator is printed beside the model: the CPU's time running the CPU kernels and dmlpatch's
Python, not a GPU's.

The model is serial: it adds the host's and the GPU's time where a real queue overlaps them, so
it is an upper bound for programs that keep the GPU busy and close for programs bound by
launches and read-backs. Its constants, and where each comes from, are in
``src/dmlpatch/costs/profiles.py``. Target: no row slower under dmlpatch than alone.
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

from dmlpatch.costs.pricing import CAUSES  # imports no torch: the driver runs no device

REPO = Path(__file__).resolve().parent.parent
# This file's directory would shadow the gfpgan package (benchmarks/gfpgan.py): drop it.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != REPO / "benchmarks"]
PROFILE = "torch-directml-0.2.5"
MODES = ("dmlpatch", "alone")
#: Per-workload time limit of one process (s): a hung run fails its row, not the benchmark.
TIMEOUT = 900

Step = Callable[[], None]


# -- the workloads: each builds its model on the device and returns one step ----------------


def yolov8n_train(device: Any) -> Step:
    """YOLOv8n training step: batch 4 at 160 px, ultralytics' own loss, AdamW (the trainer's
    choice for a short run); the loader's batch is moved to the device each step."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).to(device)
    model.args = get_cfg()  # box/cls/dfl gains, as the trainer sets them
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, size = 4, 160
    boxes = torch.tensor([[0.3, 0.3, 0.2, 0.25], [0.6, 0.5, 0.3, 0.2], [0.5, 0.7, 0.15, 0.15]])
    batch_idx = torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0, 3.0, 3.0])
    picks = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    host = {
        "img": torch.rand(images, 3, size, size),
        "cls": torch.tensor([[0.0], [1.0], [0.0], [1.0], [1.0], [0.0], [1.0]]),
        "bboxes": boxes[picks],
        "batch_idx": batch_idx,
    }

    def step() -> None:
        batch = {key: value.to(device) for key, value in host.items()}
        optimizer.zero_grad()
        loss, _ = model.loss(batch)
        loss.sum().backward()
        optimizer.step()

    return step


def gfpgan_restore(device: Any) -> Step:
    """GFPGAN v1.3 (GFPGANv1Clean, channel multiplier 2) on one 512x512 face crop and
    Real-ESRGAN's RRDBNet x2 on a 64x64 background, forward only."""
    import torch
    import torchvision.transforms._functional_tensor as renamed

    # basicsr imports the module under its pre-0.17 name; alias it (both modes alike).
    sys.modules.setdefault("torchvision.transforms.functional_tensor", renamed)
    from basicsr.archs.rrdbnet_arch import RRDBNet
    from gfpgan.archs.gfpganv1_clean_arch import GFPGANv1Clean

    face_net = GFPGANv1Clean(
        out_size=512,
        num_style_feat=512,
        channel_multiplier=2,
        decoder_load_path=None,
        fix_decoder=False,
        num_mlp=8,
        input_is_latent=True,
        different_w=True,
        narrow=1,
        sft_half=True,
    )
    face_net = face_net.eval().to(device)
    upsampler = RRDBNet(3, 3, num_feat=64, num_block=23, num_grow_ch=32, scale=2)
    upsampler = upsampler.eval().to(device)
    face = torch.rand(1, 3, 512, 512)
    background = torch.rand(1, 3, 64, 64)

    def step() -> None:
        with torch.no_grad():
            restored = face_net(face.to(device) * 2 - 1, return_rgb=False)[0]
            upscaled = upsampler(background.to(device))
            restored.clamp_(-1, 1).cpu()
            upscaled.clamp_(0, 1).cpu()

    return step


def gpt2_train(device: Any) -> Step:
    """A tiny GPT-2 (transformers; 2 layers, width 64) training step on 4x32 tokens, AdamW."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    model = GPT2LMHeadModel(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (4, 32))

    def step() -> None:
        tokens = ids.to(device)
        optimizer.zero_grad()
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()

    return step


def unet_denoise(device: Any) -> Step:
    """One denoising step of a tiny diffusers UNet2DConditionModel (32x32x4 latents,
    classifier-free guidance: batch 2, 77 text tokens) and a DDIM scheduler step."""
    import torch
    from diffusers import DDIMScheduler, UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    unet = unet.eval().to(device)
    scheduler = DDIMScheduler()
    scheduler.set_timesteps(20, device=device)
    latents = torch.randn(1, 4, 32, 32).to(device)
    text = torch.randn(2, 77, 32).to(device)
    position = [0]

    def step() -> None:
        nonlocal latents
        t = scheduler.timesteps[position[0] % len(scheduler.timesteps)]
        position[0] += 1
        with torch.no_grad():
            noise = unet(torch.cat([latents] * 2), t, encoder_hidden_states=text).sample
            unconditional, conditional = noise.chunk(2)
            guided = unconditional + 7.5 * (conditional - unconditional)
            latents = scheduler.step(guided, t, latents).prev_sample

    return step


def fasterrcnn_infer(device: Any) -> Step:
    """torchvision's Faster R-CNN (MobileNetV3-Large 320 FPN, random init, 91 classes) on two
    images, eval."""
    import torch
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None)
    model = model.eval().to(device)
    images = [torch.rand(3, 240, 320), torch.rand(3, 320, 256)]

    def step() -> None:
        with torch.no_grad():
            detections = model([image.to(device) for image in images])
            for found in detections:
                {key: value.cpu() for key, value in found.items()}

    return step


def geometry_linalg(device: Any) -> Step:
    """Kornia-style geometry written with torch.linalg (kornia is not installed): a batch of
    1024 3x3 systems solved and decomposed (``solve``, ``svd``), and 256 homographies from four
    point pairs each (an 8x8 DLT system solved per homography)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    matrices = (torch.randn(1024, 3, 3, generator=generator) + 3 * torch.eye(3)).to(device)
    rhs = torch.randn(1024, 3, 1, generator=generator).to(device)
    source = torch.rand(256, 4, 2, generator=generator)
    target = source + 0.1 * torch.randn(256, 4, 2, generator=generator)
    source, target = source.to(device), target.to(device)

    def dlt(src: Any, dst: Any) -> Any:
        x, y = src[..., 0], src[..., 1]
        u, v = dst[..., 0], dst[..., 1]
        ones, zeros = torch.ones_like(x), torch.zeros_like(x)
        rows_u = torch.stack([x, y, ones, zeros, zeros, zeros, -u * x, -u * y], dim=-1)
        rows_v = torch.stack([zeros, zeros, zeros, x, y, ones, -v * x, -v * y], dim=-1)
        system = torch.cat([rows_u, rows_v], dim=-2)  # (B, 8, 8)
        values = torch.cat([u, v], dim=-1).unsqueeze(-1)  # (B, 8, 1)
        h = torch.linalg.solve(system, values).squeeze(-1)
        return torch.cat([h, torch.ones_like(h[..., :1])], dim=-1).view(-1, 3, 3)

    def step() -> None:
        solved = torch.linalg.solve(matrices, rhs)
        u, s, vh = torch.linalg.svd(matrices)
        rotations = u @ vh  # the nearest orthogonal matrices (Procrustes)
        homographies = dlt(source, target)
        (solved.sum() + s.sum() + rotations.sum() + homographies.sum()).item()

    return step


def gaussian_process(device: Any) -> Step:
    """One Gaussian-process hyperparameter step: an RBF kernel matrix of 384 points in 3-D,
    its Cholesky factor, ``cholesky_solve``, the log-determinant, the negative log marginal
    likelihood's backward and an Adam step, in float32."""
    import torch

    generator = torch.Generator().manual_seed(0)
    points = torch.rand(384, 3, generator=generator).to(device)
    values = torch.sin(6 * points.sum(-1, keepdim=True)).to(device)
    raw = torch.zeros(3, device=device, requires_grad=True)  # lengthscale, scale, noise
    optimizer = torch.optim.Adam([raw], lr=0.05)
    eye = torch.eye(384).to(device)

    def step() -> None:
        lengthscale, scale, noise = torch.nn.functional.softplus(raw).unbind()
        distances = torch.cdist(points, points).pow(2)
        kernel = scale * torch.exp(-0.5 * distances / lengthscale**2) + (noise + 1e-3) * eye
        factor = torch.linalg.cholesky(kernel)
        alpha = torch.cholesky_solve(values, factor)
        log_det = 2 * factor.diagonal().log().sum()
        loss = 0.5 * (values * alpha).sum() + 0.5 * log_det
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()

    return step


WORKLOADS: dict[str, Callable[[Any], Step]] = {
    "yolov8n-train": yolov8n_train,
    "gfpgan+esrgan": gfpgan_restore,
    "gpt2-tiny-train": gpt2_train,
    "unet-ddim-step": unet_denoise,
    "fasterrcnn-infer": fasterrcnn_infer,
    "geometry-linalg": geometry_linalg,
    "gp-cholesky": gaussian_process,
}


# -- one (workload, mode) in this process --------------------------------------------------


def measure(name: str, mode: str, steps: int, threads: int) -> dict[str, Any]:
    """Build ``name`` on the simulated device in ``mode``, warm up one step, then price each of
    ``steps`` steps on every configured profile; per profile, the median step's figures."""
    import torch

    from dmlpatch import sim
    from dmlpatch.costs import simulated

    torch.set_num_threads(threads)
    sim.load(PROFILE)
    if mode == "dmlpatch":
        from dmlpatch import opfix

        opfix.install("sim", PROFILE)
    torch.manual_seed(0)
    step = WORKLOADS[name](sim.device())
    step()
    walls: list[float] = []
    by_profile: dict[str, list[dict[str, Any]]] = {}
    calls: list[dict[str, int]] = []
    for _ in range(steps):
        sim.reset_counters()
        started = time.perf_counter()
        step()
        walls.append(time.perf_counter() - started)
        counters = sim.counters()
        calls.append({kind: sum(ops.values()) for kind, ops in counters["ops"].items()})
        for profile in simulated.models():
            priced = simulated.priced(profile, counters).to_json(top=8)
            by_profile.setdefault(profile.name, []).append(priced)
    return {
        "wall_s": statistics.median(walls),
        "wall_s_steps": walls,
        "priced": {
            label: sorted(priced, key=lambda p: p["seconds"])[(len(priced) - 1) // 2]
            for label, priced in by_profile.items()
        },
        "seconds_steps": {
            label: [p["seconds"] for p in priced] for label, priced in by_profile.items()
        },
        "calls_steps": calls,
    }


def one(name: str, mode: str, steps: int, threads: int, out: Path) -> None:
    try:
        result = measure(name, mode, steps, threads)
    except Exception as error:  # the row says what stopped it
        first = (str(error).strip().splitlines() or [""])[0]
        result = {"error": f"{type(error).__name__}: {first}"[:300]}
    out.write_text(json.dumps(result), encoding="utf-8")


# -- the driver ----------------------------------------------------------------------------


def child_env(config: Path, threads: int) -> dict[str, str]:
    """This environment minus dmlpatch's settings (a forced op or profile would change what is
    measured), offline for the libraries that would reach for the network, ``threads`` CPU
    threads for OpenMP and MKL as for torch."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("DMLPATCH_") or key == "DMLPATCH_CACHE_DIR"
    }
    env.update(
        YOLO_OFFLINE="true",
        YOLO_CONFIG_DIR=str(config),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(REPO / "src"),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
    )
    return env


def run_one(name: str, mode: str, options: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One (workload, mode) in a fresh process; its figures, or ``{"error": why}``."""
    out = root / f"{name}.{mode}.json"
    command = [sys.executable, __file__, "--one", name, "--mode", mode, "--out", str(out)]
    command += ["--steps", str(options.steps), "--threads", str(options.threads)]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            env=child_env(root / "config", options.threads),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result in {TIMEOUT} s"}
    if not out.exists():
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"[:300]}
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    result["process_s"] = time.perf_counter() - started
    return result


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def split_cell(priced: dict[str, Any]) -> str:
    return "/".join(f"{priced['by_cause'][cause] * 1e3:.1f}" for cause in CAUSES)


def table(profile: str, results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Print one profile's table; return the workloads slower under dmlpatch."""
    print(f"\n== {profile}: modelled DirectML ms/step; split ms: {'/'.join(CAUSES)}")
    print(
        f"{'workload':<18}{'dmlpatch':>10}{'alone':>10}{'dml/alone':>10}  {'dmlpatch split':<28}"
        f"{'alone split':<28}{'sim wall ms/step on the CPU, dml / alone':>40}"
    )
    losing = []
    for name, modes in results.items():
        patched, alone = modes["dmlpatch"], modes["alone"]
        if "error" in patched:
            print(f"{name:<18}  dmlpatch failed: {patched['error']}")
            continue
        mine = patched["priced"][profile]
        if "error" in alone:
            walls = f"{ms(patched['wall_s'])} / -"
            print(
                f"{name:<18}{ms(mine['seconds']):>10}{'raises':>10}{'-':>10}  "
                f"{split_cell(mine):<28}{'-':<28}{walls:>40}"
            )
            print(f"{'':<18}  alone raises: {alone['error']}")
            continue
        theirs = alone["priced"][profile]
        ratio = mine["seconds"] / theirs["seconds"] if theirs["seconds"] else float("inf")
        mark = ""
        if ratio > 1:
            losing.append(name)
            # The host's share is a CPU kernel's measured time; the rest is counted.
            counted = [p["seconds"] - p["by_cause"]["host"] for p in (mine, theirs)]
            mark = "  SLOWER" if counted[0] > counted[1] else "  SLOWER (measured host time only)"
        walls = f"{ms(patched['wall_s'])} / {ms(alone['wall_s'])}"
        print(
            f"{name:<18}{ms(mine['seconds']):>10}{ms(theirs['seconds']):>10}{ratio:>10.3f}  "
            f"{split_cell(mine):<28}{split_cell(theirs):<28}{walls:>40}" + mark
        )
    return losing


def explain(profile: str, name: str, modes: dict[str, dict[str, Any]]) -> None:
    """The top three operators of a losing row, with what the same operators cost alone."""
    theirs = {row["operator"]: row for row in modes["alone"]["priced"][profile]["by_operator"]}
    print(f"  {profile} / {name}: top operators under dmlpatch, ms/step (alone's), split")
    for row in modes["dmlpatch"]["priced"][profile]["by_operator"][:3]:
        other = theirs.get(row["operator"])
        alone = f"({ms(other['seconds'])})" if other else "(not in its top 8)"
        causes = "/".join(f"{row[cause] * 1e3:.1f}" for cause in CAUSES)
        print(f"    {row['operator']:<40}{ms(row['seconds']):>9} {alone:<20}{causes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps (default 3)")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS), help="workload")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads of each process (default 1)"
    )
    parser.add_argument("--one", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        one(options.one, options.mode, options.steps, options.threads, options.out)
        return
    started = time.perf_counter()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="dmlpatch-bench-workloads-") as directory:
        root = Path(directory)
        (root / "config").mkdir()
        for name in options.only or WORKLOADS:
            results[name] = {mode: run_one(name, mode, options, root) for mode in MODES}
            took = ", ".join(f"{m} {r.get('process_s', 0):.0f} s" for m, r in results[name].items())
            print(f"ran {name}: {took}", flush=True)
    priced = [mode.get("priced") for modes in results.values() for mode in modes.values()]
    profiles = next((list(figures) for figures in priced if figures), [])
    losing = {profile: table(profile, results) for profile in profiles}
    if any(losing.values()):
        print("\nrows slower under dmlpatch:")
        for profile, names in losing.items():
            for name in names:
                explain(profile, name, results[name])
    print(
        f"\nper step: the median of {options.steps} measured steps, {options.threads} CPU "
        f"thread(s) per process; total {time.perf_counter() - started:.0f} s"
    )
    if options.json:
        document = {
            "steps": options.steps,
            "threads": options.threads,
            "sim_profile": PROFILE,
            "results": results,
        }
        options.json.write_text(json.dumps(document, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
