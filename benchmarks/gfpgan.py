"""GFPGAN on the simulated DirectML device: dmlpatch vs hand-edited code vs the CPU, side by side.

    .venv/bin/python benchmarks/gfpgan.py [--rounds N]

Wall time of the upstream demo (``inference_gfpgan.py -v 1.3``, random-init weights from
``tests/e2e/gfpgan/gfpgan_fixtures.py``, fetched and built into a temporary directory) for two
workloads: an aligned face (``--aligned --bg_upsampler none``) and one whole image with the
Real-ESRGAN x2 background upsampler. Three ways of running it:

- ``dmlpatch``: ``python -m dmlpatch --device sim inference_gfpgan.py ...``, the script and the
  four libraries unmodified;
- ``hand-edited``: what users do without dmlpatch (the blog recipe), applied textually to a
  temporary copy of basicsr, facexlib, gfpgan and realesrgan and of the script: every device
  choice on the inference path becomes ``torch.device('privateuseone', 0)``, the
  ``functional_tensor`` import is fixed, fused_act/upfirdn2d take their PyTorch path off CUDA,
  the script's ``torch.cuda.is_available()`` check no longer drops the upsampler and
  ``half=True`` becomes ``half=False``; a ``sitecustomize`` loads the simulated device
  (``dmlpatch.sim.load()``, none of dmlpatch's engine);
- ``cpu``: a plain CPU run of the same edited script over a copy of the libraries with only the
  ``functional_tensor`` import fixed.

Every configuration imports its libraries from a copy of the same shape (a temporary directory
first on ``PYTHONPATH``; dmlpatch's copy is byte-for-byte the installed one), so import paths,
``.pyc`` files and Real-ESRGAN's weight location (``<copy>/weights``) are alike and nothing is
written into site-packages. Each configuration first imports everything once (``.pyc`` files,
dmlpatch's cache of rewritten code), as a user's earlier runs would have; the measured rounds
are interleaved so every configuration sees the same machine noise. Both device
runs must do the same device work: equal convolution counts on ``privateuseone:0``, no CPU
fallback and no refused op. Prints medians of wall and CPU seconds and the ratio
dmlpatch/hand-edited (target <= 1.02).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
# This file's own directory would shadow the gfpgan package (benchmarks/gfpgan.py): replace it.
sys.path[0] = str(REPO / "tests" / "e2e" / "gfpgan")

import gfpgan_fixtures  # noqa: E402  (a test helper, found through the path above)

PYTHON = sys.executable
LIBRARIES = ("basicsr", "facexlib", "gfpgan", "realesrgan")
CUDA_ELSE_CPU = "torch.device('cuda' if torch.cuda.is_available() else 'cpu')"
DML = "torch.device('privateuseone', 0)"
FUSED_DEF = "def fused_leaky_relu(input, bias, negative_slope=0.2, scale=2**0.5):\n"
FUSED_PYTORCH_PATH = (
    "    if input.device.type != 'cuda':\n"
    "        rest_dim = [1] * (input.ndim - bias.ndim - 1)\n"
    "        return torch.nn.functional.leaky_relu(\n"
    "            input + bias.view(1, bias.shape[0], *rest_dim), negative_slope=negative_slope\n"
    "        ) * scale\n"
)
#: (file in the copy, old text, new text, expected occurrences)
IMPORT_FIX = (
    "basicsr/data/degradations.py",
    "torchvision.transforms.functional_tensor",
    "torchvision.transforms._functional_tensor",
    1,
)
HAND_EDITS = (
    IMPORT_FIX,
    ("gfpgan/utils.py", CUDA_ELSE_CPU, DML, 1),
    ("facexlib/utils/face_restoration_helper.py", CUDA_ELSE_CPU, DML, 1),
    ("facexlib/detection/retinaface.py", CUDA_ELSE_CPU, DML, 1),
    ("realesrgan/utils.py", CUDA_ELSE_CPU, DML, 1),
    (
        "basicsr/ops/upfirdn2d/upfirdn2d.py",
        "if input.device.type == 'cpu':",
        "if input.device.type != 'cuda':",
        1,
    ),
    ("basicsr/ops/fused_act/fused_act.py", FUSED_DEF, FUSED_DEF + FUSED_PYTORCH_PATH, 1),
)
SCRIPT_EDITS = (
    ("", "if not torch.cuda.is_available():  # CPU", "if False:  # CPU", 1),
    ("", "half=True)", "half=False)", 1),
)
#: The hand-edited runs' bootstrap: the simulated device, and its counters at exit.
BOOTSTRAP = """\
import atexit, json, os
import dmlpatch.sim

dmlpatch.sim.load()


def _dump():
    with open(os.environ["BENCH_COUNTERS"], "w", encoding="utf-8") as handle:
        json.dump(dmlpatch.sim.counters()["ops"], handle)


atexit.register(_dump)
"""
WORKLOADS = {
    "aligned face": ("aligned", ["--aligned", "--bg_upsampler", "none"]),
    "whole image + bg": ("whole", []),
}
CONFIGS = ("cpu", "dmlpatch", "hand-edited")


@dataclass
class Config:
    name: str
    pythonpath: str
    script: Path
    prefix: list[str] = field(default_factory=list)


@dataclass
class Sample:
    wall: float
    cpu: float
    ops: Optional[dict[str, Any]]


def copy_libraries(destination: Path, weights: Path) -> Path:
    """The four packages as installed (no ``__pycache__``), plus Real-ESRGAN's weights dir."""
    import importlib.util

    destination.mkdir(parents=True)
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)  # a top-level package: found, not imported
        assert spec is not None and spec.submodule_search_locations, name
        source = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(source, destination / name, ignore=shutil.ignore_patterns("__pycache__"))
    # realesrgan.utils resolves the script's URL to ROOT_DIR/weights, ROOT_DIR being the copy.
    (destination / "weights").mkdir()
    os.link(weights, destination / "weights" / weights.name)
    return destination


def edit(root: Path, edits: tuple[tuple[str, str, str, int], ...]) -> None:
    """Apply textual edits; each must match exactly as often as expected (else the recipe
    no longer fits the installed version and the comparison would be meaningless)."""
    for relative, old, new, count in edits:
        path = root / relative if relative else root
        text = path.read_text(encoding="utf-8")
        found = text.count(old)
        if found != count:
            raise SystemExit(f"hand edit of {path}: {old!r} found {found}x, expected {count}")
        path.write_text(text.replace(old, new), encoding="utf-8")


def prepare(root: Path) -> tuple[Path, dict[str, Config]]:
    assets = root / "assets"
    env = clean_env()
    subprocess.run(
        [PYTHON, "-m", "dmlpatch", "--device", "cpu", gfpgan_fixtures.__file__, str(assets)],
        env=env,
        check=True,
        capture_output=True,
    )
    sdist = root / "sdist"
    sdist.mkdir()
    script = gfpgan_fixtures.upstream_script(sdist, env)
    edited = root / "inference_gfpgan_edited.py"
    shutil.copyfile(script, edited)
    edit(edited, SCRIPT_EDITS)
    weights = assets / "realesrgan" / "RealESRGAN_x2plus.pth"

    pristine = copy_libraries(root / "libs-pristine", weights)
    cpu = copy_libraries(root / "libs-cpu", weights)
    edit(cpu, (IMPORT_FIX,))
    hand = copy_libraries(root / "libs-hand", weights)
    edit(hand, HAND_EDITS)
    boot = root / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(BOOTSTRAP, encoding="utf-8")

    configs = {
        "cpu": Config("cpu", str(cpu), edited),
        "dmlpatch": Config(
            "dmlpatch", str(pristine), script, ["-m", "dmlpatch", "--device", "sim"]
        ),
        "hand-edited": Config("hand-edited", f"{boot}{os.pathsep}{hand}", edited),
    }
    return assets, configs


def clean_env(**extra: str) -> dict[str, str]:
    """This environment minus dmlpatch's settings and PYTHONPATH; ``.pyc`` files are written
    and reused, as in users' interpreters (a benchmark without them measures the compiler)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DMLPATCH_") or k == "DMLPATCH_CACHE_DIR"
    }
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra)
    return env


def run(config: Config, assets: Path, workload: str, work: Path) -> Sample:
    folder, flags = WORKLOADS[workload]
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "gfpgan").exists():
        (work / "gfpgan").symlink_to(assets / "gfpgan", target_is_directory=True)
    counters = work / "ops.json"
    counters.unlink(missing_ok=True)
    prefix = list(config.prefix)
    if config.name == "dmlpatch":
        prefix.append(f"--report={counters}")
    command = [PYTHON, *prefix, str(config.script), "-i", str(assets / "inputs" / folder)]
    command += ["-o", str(work / "results"), "-v", "1.3", "-s", "2", *flags]
    env = clean_env(PYTHONPATH=config.pythonpath, BENCH_COUNTERS=str(counters))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or "Failed inference" in done.stdout:
        raise SystemExit(f"{config.name} / {workload} failed:\n{done.stdout}\n{done.stderr}")
    if not flags and "Tile 1/1" not in done.stdout:
        raise SystemExit(f"{config.name} / {workload}: the background upsampler did not run")
    ops = None
    if config.name != "cpu":
        data = json.loads(counters.read_text())
        ops = data["ops"] if config.name == "dmlpatch" else data
    cpu_seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Sample(wall, cpu_seconds, ops)


def check_same_device_work(workload: str, dmlpatch: Sample, hand: Sample) -> int:
    """Both device runs ran every convolution on the device, the same number of them."""
    convs = []
    for name, sample in (("dmlpatch", dmlpatch), ("hand-edited", hand)):
        assert sample.ops is not None
        if sample.ops["fallback"] or sample.ops["refused"]:
            raise SystemExit(f"{name} / {workload}: CPU fallbacks or refused ops: {sample.ops}")
        convs.append(sample.ops["native"].get("aten::convolution_overrideable", 0))
    if convs[0] != convs[1] or convs[0] == 0:
        raise SystemExit(f"{workload}: device convolutions differ (dmlpatch, hand): {convs}")
    return convs[0]


def warm_up(config: Config, root: Path) -> None:
    """Import the libraries once (``.pyc`` files, dmlpatch's cache of rewritten code), as a
    user's earlier runs would have."""
    warm = root / "warm.py"
    warm.write_text("import gfpgan, realesrgan\n", encoding="utf-8")
    env = clean_env(PYTHONPATH=config.pythonpath, BENCH_COUNTERS=str(root / "warm.json"))
    subprocess.run([PYTHON, *config.prefix, str(warm)], env=env, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    options = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dmlpatch-bench-gfpgan-") as directory:
        root = Path(directory)
        assets, configs = prepare(root)
        for config in configs.values():
            warm_up(config, root)
        print(f"fixtures, sdist, library copies, warm-up: {time.perf_counter() - started:.0f} s")
        samples: dict[tuple[str, str], list[Sample]] = {}
        convs: dict[str, int] = {}
        for round_ in range(options.rounds):
            for workload in WORKLOADS:
                order = CONFIGS if round_ % 2 else tuple(reversed(CONFIGS))
                got = {
                    name: run(configs[name], assets, workload, root / "work" / name)
                    for name in order
                }
                convs[workload] = check_same_device_work(
                    workload, got["dmlpatch"], got["hand-edited"]
                )
                for name, sample in got.items():
                    samples.setdefault((workload, name), []).append(sample)
    report(samples, convs, options.rounds)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"total: {time.perf_counter() - started:.0f} s; "
        f"load average now {load} ({os.cpu_count()} CPUs)"
    )


def report(
    samples: dict[tuple[str, str], list[Sample]], convs: dict[str, int], rounds: int
) -> None:
    print(f"medians of {rounds} interleaved rounds; wall s (CPU s of the process)")
    header = f"{'workload':<18}" + "".join(f"{name:>18}" for name in CONFIGS)
    print(header + f"{'dmlpatch/hand':>15}{'paired':>8}{'device convs':>14}")
    for workload in WORKLOADS:
        runs = {name: samples[workload, name] for name in CONFIGS}
        wall = {n: statistics.median(s.wall for s in runs[n]) for n in CONFIGS}
        cpu = {n: statistics.median(s.cpu for s in runs[n]) for n in CONFIGS}
        cells = "".join(f"{f'{wall[n]:.2f} ({cpu[n]:.2f})':>18}" for n in CONFIGS)
        ratio = wall["dmlpatch"] / wall["hand-edited"]
        # The same ratio per round (adjacent runs, the same machine noise), then the median.
        pairs = zip(runs["dmlpatch"], runs["hand-edited"])
        paired = statistics.median(d.wall / h.wall for d, h in pairs)
        print(f"{workload:<18}{cells}{ratio:>15.3f}{paired:>8.3f}{convs[workload]:>14}")
    for workload in WORKLOADS:
        rows = {n: " ".join(f"{s.wall:.2f}" for s in samples[workload, n]) for n in CONFIGS}
        print(f"  {workload} per round: " + "; ".join(f"{n} {r}" for n, r in rows.items()))


if __name__ == "__main__":
    main()
