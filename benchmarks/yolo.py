"""One YOLO training epoch: CPU vs the simulated DirectML device under dmlpatch, side by side.

    python benchmarks/yolo.py [--steps-json]

Builds the tests' synthetic dataset (8 train, 4 val images at 64x64) in a temporary directory
and runs ``tests/e2e/yolo/train_api.py`` (``YOLO('yolov8n.yaml').train(epochs=1, batch=4)``, then
val and predict) three times, offline: on the CPU without dmlpatch; under
``python -m dmlpatch --device sim`` with the default profile (torch-directml 0.2.5's gaps); and
with the ``permissive`` profile (no gaps). Per training step it prints the copies and CPU
fallbacks of each run; copies caused by DirectML gaps are the default profile's minus the
permissive profile's, and must be 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "e2e" / "yolo")]

import yolo_fixtures  # noqa: E402  (a test helper, found through the path above)

SCRIPT = REPO / "tests" / "e2e" / "yolo" / "train_api.py"


def run(root: Path, data: Path, name: str, device: str, profile: str | None) -> dict[str, Any]:
    out = root / f"{name}.json"
    prefix = ["-m", "dmlpatch", "--device", "sim"] if profile else []
    extra = {"DMLPATCH_SIM_PROFILE": profile} if profile else {}
    env = yolo_fixtures.offline_env(root / "config", root / "network.log", **extra)
    command = [sys.executable, *prefix, str(SCRIPT), str(data), str(root / name), str(out)]
    started = time.perf_counter()
    subprocess.run([*command, device, "False"], env=env, check=True, capture_output=True)
    result = json.loads(out.read_text())
    result["seconds"] = time.perf_counter() - started
    return result


def per_step(result: dict[str, Any], key: str) -> float:
    steps = result["steps"]
    total = sum(sum(phase.get(key, 0) for phase in s["copies"].values()) for s in steps)
    return total / len(steps)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dmlpatch-bench-yolo-") as directory:
        root = Path(directory)
        data = yolo_fixtures.build_dataset(root / "data")
        yolo_fixtures.build_config_dir(root / "config")
        runs = {
            "cpu": run(root, data, "cpu", "cpu", None),
            "sim (0.2.5)": run(root, data, "sim", "dml", "torch-directml-0.2.5"),
            "sim (permissive)": run(root, data, "perm", "dml", "permissive"),
        }
    print(f"{'run':<18}{'wall s':>8}{'h2d/step':>10}{'d2h/step':>10}{'fallback/step':>15}")
    for name, result in runs.items():
        print(
            f"{name:<18}{result['seconds']:>8.1f}{per_step(result, 'h2d'):>10.1f}"
            f"{per_step(result, 'd2h'):>10.1f}{per_step(result, 'fallback'):>15.1f}"
        )
    default, permissive = runs["sim (0.2.5)"], runs["sim (permissive)"]
    gap = sum(per_step(default, k) - per_step(permissive, k) for k in ("h2d", "d2h", "fallback"))
    print(f"copies + fallbacks per step caused by DirectML gaps: {gap:g}")
    if "--steps-json" in sys.argv:
        print(json.dumps({k: v["steps"] for k, v in runs.items()}, indent=2))


if __name__ == "__main__":
    main()
