"""What the check at every device parameter costs a whole step (``device_argument`` sites:
``x.to(dtype)``, ``torch.arange(n, device=device)`` in the libraries dmlpatch rewrites).

A tiny GPT-2 training step (transformers, whose modeling code names CUDA and so is rewritten)
and a diffusers UNet forward, under the runner's rewriting, on the simulated device and under
``--device cpu``: the same step with the runtime's check as shipped, and with it replaced by
the identity (what the step would cost had those values not been checked), interleaved, best of
rounds; and how many checks one step makes.

    python benchmarks/device_arguments.py [--rounds N]   # runs itself under python -m dmlpatch
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any, Callable

WORKLOAD = "DMLPATCH_BENCH_WORKLOAD"


def _gpt2() -> Callable[[], None]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128)).to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(0, 128, (4, 32), device="cuda")

    def step() -> None:
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    return step


def _unet() -> Callable[[], None]:
    import torch
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64),
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    ).to("cuda")
    sample = torch.randn(2, 3, 16, 16, device="cuda")

    def step() -> None:
        with torch.no_grad():
            unet(sample, 10)

    return step


def _measure(rounds: int) -> None:
    from dmlpatch.runtime import sites

    checked = sites.device_argument
    calls = 0

    def counting(value: Any) -> Any:
        nonlocal calls
        calls += 1
        return checked(value)

    for name, make in (("GPT-2 training step", _gpt2), ("UNet forward", _unet)):
        step = make()
        step()
        sites.device_argument = counting
        calls = 0
        step()
        per_step = calls
        best = {"checked": 1e9, "identity": 1e9}
        for _ in range(rounds):
            for label, function in (("checked", checked), ("identity", lambda v: v)):
                sites.device_argument = function
                started = time.perf_counter()
                for _ in range(5):
                    step()
                best[label] = min(best[label], (time.perf_counter() - started) / 5)
        sites.device_argument = checked
        ratio = best["checked"] / best["identity"]
        print(
            f"  {name:22} {per_step:5d} checks/step  {best['checked'] * 1e3:8.2f} ms checked,"
            f" {best['identity'] * 1e3:8.2f} ms identity  {ratio:5.3f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if os.environ.get(WORKLOAD):
        _measure(args.rounds)
        return
    for device in ("sim", "cpu"):
        print(f"--device {device}:", flush=True)
        env = {**os.environ, WORKLOAD: "1", "DMLPATCH_QUIET": "1"}
        subprocess.run(
            [sys.executable, "-m", "dmlpatch", "--device", device, __file__, *sys.argv[1:]],
            env=env,
            check=True,
        )


if __name__ == "__main__":
    main()
