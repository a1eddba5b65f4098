"""The demo: train_cnn.py, unmodified, on the CPU and on the simulated DirectML device.

    python examples/demo.py          (scripts/demo.sh sets up .venv, then runs this)

The CPU run is the program as plain python runs it; the device run is the same program under
``python -m dmlpatch --device sim``. The simulated device's first use compiles it (C++, once):
the CPU run goes meanwhile. At the end, the losses side by side and one line from the device
run's report: where model compute ran, CPU fallbacks, operators fixed on the device, and
host<->device copies.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = [str(HERE / "train_cnn.py"), "--epochs", "1", "--samples", "512", "--batch-size", "16"]
LOSS = re.compile(r"^\[(\d+),\s*(\d+)\] loss: ([\d.]+)$")
START = time.monotonic()


def say(text: str) -> None:
    print(f"[demo {time.monotonic() - START:5.1f}s] {text}", flush=True)


def losses(output: str) -> list[tuple[str, str]]:
    """(step, loss) for each loss line train_cnn.py prints."""
    found = []
    for line in output.splitlines():
        match = LOSS.match(line.strip())
        if match:
            found.append((f"{match.group(1)}:{match.group(2)}", match.group(3)))
    return found


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def summary(report: dict[str, Any]) -> str:
    """One line: where model compute ran, fallbacks, fixes and copies."""
    compute = report.get("compute") or {}
    share = compute.get("device_share")
    flops = (compute.get("on_device") or {}).get("flops", 0) + (compute.get("on_cpu") or {}).get(
        "flops", 0
    )
    where = (
        f"{round(100 * share)}% of model compute ({flops / 1e9:.2f} GFLOP) on {report['device']}"
        if share is not None
        else "no model compute counted"
    )
    ops = report.get("ops") or {}
    fallbacks, fixed = ops.get("fallback") or {}, ops.get("fixed") or {}
    transfers = report.get("transfers") or {}
    program = transfers.get("program") or {}
    copies = sum(entry["count"] for entry in program.values())
    moved = sum(entry["bytes"] for entry in program.values())
    by_fallbacks = transfers.get("fallback") or {"count": 0, "bytes": 0}
    return (
        f"{where}; CPU fallbacks: {len(fallbacks)} operator(s), {sum(fallbacks.values())} calls; "
        f"fixed on the device: {len(fixed)} operator(s), {sum(fixed.values())} calls; "
        f"host<->device copies: {copies} by the program ({_size(moved)}), "
        f"{by_fallbacks['count']} by fallbacks ({_size(by_fallbacks['bytes'])})"
    )


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", help="keep the device run's report (JSON) in this file")
    options = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(options.report or Path(scratch) / "report.json").resolve()
        say("training on the CPU (plain python), and meanwhile building the simulated device")
        cpu = subprocess.Popen(
            [python, *TRAIN],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},  # the build has the other core
        )
        build = subprocess.run(
            [python, "-c", "from dmlpatch.sim import build; build.ensure_built()"], check=False
        )
        cpu_out, _ = cpu.communicate()
        if cpu.returncode or build.returncode:
            say("the CPU run or the simulated device's build failed (see above)")
            return 1
        say("training on the simulated DirectML device: python -m dmlpatch --device sim ...")
        device = subprocess.run(
            [python, "-m", "dmlpatch", "--device", "sim", f"--report={report_path}", *TRAIN],
            stdout=subprocess.PIPE,
            text=True,
        )
        sys.stdout.write(device.stdout)
        if device.returncode:
            say(f"the device run failed with exit code {device.returncode}")
            return device.returncode
        report = json.loads(report_path.read_text(encoding="utf-8"))
    on_cpu, on_device = losses(cpu_out), losses(device.stdout)
    name = report["device"]
    print(f"\n{'step':>6}  {'loss on the CPU':>15}  {'loss on ' + name:>24}")
    for (step, cpu_loss), (_, device_loss) in zip(on_cpu, on_device):
        print(f"{step:>6}  {cpu_loss:>15}  {device_loss:>24}")
    same = len(on_cpu) == len(on_device) and all(a[1] == b[1] for a, b in zip(on_cpu, on_device))
    print(("the same losses" if same else "the losses differ") + f" ({len(on_cpu)} lines)")
    print(f"summary: {summary(report)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
