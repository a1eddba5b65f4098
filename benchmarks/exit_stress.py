"""Exit stress: a small transformer trains on the simulated device, many times, under load.

    python benchmarks/exit_stress.py [--runs N] [--parallel P] [--entry runner|auto|plain]
                                     [--workload encoder|bert]

Each run is a fresh ``python -m dmlpatch --device sim`` process (``--entry auto``: ``import
dmlpatch.auto`` with ``DMLPATCH_DEVICE=sim``; ``plain``: python on the CPU, for comparison)
training a small transformer for a few steps, the device chosen the CUDA way, P of them at once
(default 3 on a 2-core machine: the load under which the abort was seen). ``encoder``: a
two-layer ``nn.TransformerEncoder`` whose script ends right after its last backward pass (what
autograd's device thread still holds is let go while the interpreter shuts down); ``bert``: a
transformers ``BertForSequenceClassification`` with AdamW (offline, random init).
A run fails when it does not exit 0 or its stderr holds anything but dmlpatch's "running on"
line: ``terminate called without an active exception`` (a C++ thread destroyed while joinable,
or a thread ended inside a C++ destructor while taking the GIL during shutdown; SIGABRT, exit
-6) was the failure this looks for, once in about 40 runs. Prints the failures with their stderr
and a summary line; exit status 1 on any. Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORKLOADS = {
    "encoder": textwrap.dedent(
        """
        import torch
        from torch import nn

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                           batch_first=True)
        model = nn.Sequential(nn.Embedding(100, 32), nn.TransformerEncoder(layer, num_layers=2))
        head = nn.Linear(32, 100)
        model, head = model.to(device), head.to(device)
        optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-3)
        tokens = torch.randint(0, 100, (8, 16), device=device)
        print("training on", tokens.device, flush=True)
        for step in range(5):
            optimizer.step()
            optimizer.zero_grad()
            logits = head(model(tokens))
            loss = nn.functional.cross_entropy(logits.reshape(-1, 100), tokens.reshape(-1))
            loss.backward()
        """
    ),
    "bert": textwrap.dedent(
        """
        import torch
        from transformers import BertConfig, BertForSequenceClassification

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.manual_seed(0)
        config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=32, num_labels=3)
        model = BertForSequenceClassification(config).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 100, (8, 16), device=device)
        labels = torch.randint(0, 3, (8,), device=device)
        for step in range(3):
            optimizer.zero_grad()
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
            out.loss.backward()
            optimizer.step()
        print(f"loss {out.loss.item():.4f} on {ids.device}")
        """
    ),
}


def command(entry: str, script: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLPATCH_")}
    if "DMLPATCH_CACHE_DIR" in os.environ:
        env["DMLPATCH_CACHE_DIR"] = os.environ["DMLPATCH_CACHE_DIR"]
    env["HF_HUB_OFFLINE"] = "1"
    if entry == "runner":
        return [sys.executable, "-m", "dmlpatch", "--device", "sim", str(script)], env
    if entry == "auto":
        env["DMLPATCH_DEVICE"] = "sim"
        return [sys.executable, str(script.with_name("auto_train.py"))], env
    return [sys.executable, str(script)], env


def run_once(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    completed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    return completed.returncode, completed.stdout, completed.stderr


def unexpected(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("dmlpatch: running on")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--entry", choices=("runner", "auto", "plain"), default="runner")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="encoder")
    args = parser.parse_args()
    train = WORKLOADS[args.workload]
    with tempfile.TemporaryDirectory() as directory:
        script = Path(directory) / "train.py"
        script.write_text(train, encoding="utf-8")
        (Path(directory) / "auto_train.py").write_text("import dmlpatch.auto\n" + train)
        argv, env = command(args.entry, script)
        first = run_once(argv, env)  # the simulator's build, if the cache is cold
        if first[0] != 0:
            print(f"the first run failed (exit {first[0]}):\n{first[2]}")
            return 1
        started = time.perf_counter()
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda _: run_once(argv, env), range(args.runs)))
        elapsed = time.perf_counter() - started
    failures = [(code, err) for code, _, err in results if code != 0 or unexpected(err)]
    for code, err in failures:
        print(f"--- exit {code}:\n{err.strip()}")
    aborts = sum("terminate called" in err for _, err in failures)
    print(
        f"{args.workload} under {args.entry}: {args.runs} runs, {args.parallel} at once, "
        f"{elapsed:.0f} s: "
        f"{len(failures)} failed ({aborts} with 'terminate called')"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
