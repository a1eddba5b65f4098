"""What the fixes of DirectML's wrong answers cost the calls DirectML gets right.

    python benchmarks/fix_tax.py [--rounds N]

Two workloads on the simulated device, each timed in its own process under the default
profile (DirectML 0.2.5's gaps, dmlpatch's fixes installed) and under the permissive profile
(no gaps, no fixes), the two interleaved round by round so that both see the same machine
noise; each process measures its own CPU time on one thread (the best of five runs), the figure
is the median of the rounds and the ratio default / permissive:

- a launch-bound elementwise loop on small tensors (mul, mul_, add, sum, mean, to(float16):
  what a GPU mostly sees in LLM decoding, small models and on iGPUs);
- a small transformer encoder's training step (a padding mask; SGD without foreach, whose
  step DirectML runs natively: the optimizers' fixes are measured by benchmarks/ops.py).

Targets: the loop within 1.10x, the training step within 1.03x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROGRAM = r"""
import json, sys, time, torch
import dmlpatch.sim as sim
from dmlpatch import opfix

profile, workload = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)  # CPU time below is this one thread's work, whatever the machine's load
sim.load(profile)
opfix.install("sim", profile)
dev = sim.device(0)
torch.manual_seed(0)


def loop():
    x, y = torch.randn(256, device=dev), torch.randn(256, device=dev)
    def step():
        z = x * y
        z.mul_(0.5)
        z = z + x
        s = z.sum(0)
        m = z.mean()
        h = z.to(torch.float16)
        return s, m, h
    return step, 200


def transformer():
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(8, 32, 64).to(dev)
    lengths = torch.tensor([32, 30, 28, 25, 32, 20, 31, 16])
    padding = (torch.arange(32)[None, :] >= lengths[:, None]).to(dev)
    def step():
        out = model(x, src_key_padding_mask=padding)
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step, 5


step, repeat = {"loop": loop, "transformer": transformer}[workload]()
for _ in range(3):
    step()
best = float("inf")
for _ in range(5):
    start = time.process_time()
    for _ in range(repeat):
        step()
    best = min(best, (time.process_time() - start) / repeat)
print(json.dumps(best * 1e6))
"""

PROFILES = ("torch-directml-0.2.5", "permissive")


def _measure(profile: str, workload: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, profile, workload],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    print(f"{'workload':34} {'fixed us':>10} {'no fixes us':>12} {'ratio':>7}")
    for workload, label in (
        ("loop", "elementwise loop (per iteration)"),
        ("transformer", "transformer training step"),
    ):
        times: dict[str, list[float]] = {p: [] for p in PROFILES}
        for _ in range(rounds):
            for profile in PROFILES:
                times[profile].append(_measure(profile, workload))
        fixed, plain = (statistics.median(times[p]) for p in PROFILES)
        print(f"{label:34} {fixed:10.1f} {plain:12.1f} {fixed / plain:6.2f}x")


if __name__ == "__main__":
    main()
