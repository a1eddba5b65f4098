"""DDP over gloo on simulated DirectML adapters: step time and bytes staged through the host.

Run: ``python benchmarks/ddp.py [--steps N] [--width W]``. Four jobs, each a CUDA-style DDP
script (NCCL requested, one process per GPU, torch.multiprocessing.spawn), one thread per rank:

- ``sim x1`` / ``sim x2``: under ``python -m dmlpatch --device sim[:0,1]`` (the gradient buckets
  go through dmlpatch's host-staging communication hook);
- ``cpu x1`` / ``cpu x2``: the same script without dmlpatch on CPU tensors (gloo's own path).

Printed side by side: median step time per rank, the bytes each rank staged per step for the
gradients (device->host + host->device, excluding the batch), and the hook's overhead: sim x2 over
cpu x2. On the simulator "device" memory is host memory, so the overhead is the staging copies
and the hook's Python, not a real bus.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


# -- the CUDA-style script each job runs ---------------------------------------------------


def _rank(rank: int, world: int, port: int, out: str, steps: int, width: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)
    ddp = DDP(net, device_ids=[rank] if device.type != "cpu" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    counters = _counters_or_none()
    times, staged = [], []
    for step in range(steps + 3):
        inputs = torch.randn(32, width).to(device)
        targets = torch.randint(0, 10, (32,)).to(device)
        before = counters() if counters else None
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(inputs), targets).backward()
        optimizer.step()
        float(net[0].weight[0, 0])  # wait for the device, as a training loop's logging does
        if step >= 3:  # after DDP has rebuilt its buckets
            times.append(time.perf_counter() - start)
            if counters and before is not None:
                after = counters()
                staged.append(sum(after[k]["bytes"] - before[k]["bytes"] for k in ("d2h", "h2d")))
    gradient_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    with open(f"{out}.{rank}", "w") as stream:
        json.dump({"times": times, "staged": staged, "gradient_bytes": gradient_bytes}, stream)
    dist.destroy_process_group()


def _counters_or_none() -> Any:
    try:
        import dmlpatch.sim
    except ImportError:
        return None
    if not dmlpatch.sim.is_loaded():
        return None
    return lambda: dmlpatch.sim.counters()["transfers"]


def _worker(arguments: argparse.Namespace) -> None:
    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count() if torch.cuda.is_available() else arguments.world
    mp.spawn(
        _rank,
        args=(world, arguments.port, arguments.out, arguments.steps, arguments.width),
        nprocs=world,
    )


# -- the benchmark -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _job(
    label: str, world: int, sim: bool, steps: int, width: int, scratch: Path
) -> dict[str, Any]:
    out = scratch / label.replace(" ", "_")
    worker = [
        str(Path(__file__).resolve()),
        "--worker",
        f"--world={world}",
        f"--port={_free_port()}",
        f"--out={out}",
        f"--steps={steps}",
        f"--width={width}",
    ]
    env = dict(os.environ, DMLPATCH_SIM_DEVICES="2", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    if sim:
        device = "sim" if world == 1 else "sim:" + ",".join(str(i) for i in range(world))
        command = [sys.executable, "-m", "dmlpatch", "--device", device, *worker]
    else:
        env["DMLPATCH_DISABLE"] = "1"
        command = [sys.executable, *worker]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"ddp.py: job {label!r} exited {done.returncode}; stderr ends:\n{tail}")
    ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(world)]
    times = [t for rank in ranks for t in rank["times"]]
    staged = [s for rank in ranks for s in rank["staged"]]
    return {
        "label": label,
        "step_ms": statistics.median(times) * 1e3,
        "staged": statistics.median(staged) if staged else 0,
        "gradient_bytes": ranks[0]["gradient_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        _worker(arguments)
        return

    with tempfile.TemporaryDirectory() as scratch:
        rows = [
            _job(label, world, sim, arguments.steps, arguments.width, Path(scratch))
            for label, world, sim in (
                ("cpu x1", 1, False),
                ("sim x1", 1, True),
                ("cpu x2", 2, False),
                ("sim x2", 2, True),
            )
        ]
    by_label = {row["label"]: row for row in rows}
    gradient = rows[0]["gradient_bytes"]
    print(
        f"model: {gradient / 1e6:.2f} MB of gradients; median of {arguments.steps} steps per rank"
    )
    print(f"{'job':<8} {'step ms':>8} {'staged/step':>12} {'= x gradient':>13}")
    for row in rows:
        ratio = row["staged"] / gradient if gradient else 0.0
        print(f"{row['label']:<8} {row['step_ms']:8.2f} {row['staged']:12.0f} {ratio:13.2f}")
    overhead = by_label["sim x2"]["step_ms"] / by_label["cpu x2"]["step_ms"]
    scaling = by_label["sim x2"]["step_ms"] / by_label["sim x1"]["step_ms"]
    print(
        f"hook overhead (sim x2 / cpu x2): {overhead:.2f}x; "
        f"2 adapters vs 1 (step time per rank): {scaling:.2f}x; "
        f"staged per step on 2 adapters: {by_label['sim x2']['staged'] / gradient:.2f} x gradient"
    )


if __name__ == "__main__":
    main()
