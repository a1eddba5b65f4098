"""Hogwild: a model shared between processes (tests/e2e/multi/hogwild_program.py, PyTorch's
examples/mnist_hogwild on random data) trains under dmlpatch as plain python trains it on the
CPU, with workers started by spawn and by fork.

Before, dmlpatch stopped the spawned workers (``a tensor on privateuseone:0 cannot be handed to
another process``) and let forked ones train private copies: the parent's model came back
untouched. Now ``model.share_memory()`` keeps the weights in host shared memory and each
forward computes on the device with copies of them. One worker, or several taking their steps
in turn, give the CPU's losses bit for bit; several running freely race as Hogwild does, so
only what does not race is compared.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from support import Result, run_python

PROGRAM = Path(__file__).parent / "multi" / "hogwild_program.py"
SHARED = re.compile(
    r"^dmlpatch: Net\.share_memory\(\) at \S*hogwild_program\.py:\d+: DirectML has no "
    r"inter-process memory, so its weights are shared in host memory; a forward given tensors "
    r"on privateuseone:0 computes there with copies of them, and the gradients come back to "
    r"the shared weights$"
)
#: What a run prints that does not depend on where it computed.
TRAINING = re.compile(r"^(rank \d+ step \d+ loss|exit codes|parent loss|weights) ")


def _run(options: list[str], *runner: str) -> Result:
    result = run_python([*runner, str(PROGRAM), *options], cwd=PROGRAM.parent, timeout=600)
    assert result.code == 0, result.err
    return result


def _training(result: Result) -> list[str]:
    return [line for line in result.out.splitlines() if TRAINING.match(line)]


def _compare_with_the_cpu(options: list[str]) -> tuple[list[str], Result]:
    on_the_cpu = _training(_run(options))
    patched = _run(options, "-m", "dmlpatch", "--device", "sim")
    assert _training(patched) == on_the_cpu
    assert "parent computed on privateuseone:0" in patched.out
    assert [line for line in patched.err_lines if SHARED.match(line)] == [
        line for line in patched.err_lines if "share_memory" in line
    ]
    assert len([line for line in patched.err_lines if SHARED.match(line)]) == 1
    return on_the_cpu, patched


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_one_worker_trains_as_on_the_cpu(start: str) -> None:
    on_the_cpu, _ = _compare_with_the_cpu(["--cuda", "--start", start, "--num-processes", "1"])
    assert [line.split(" loss ")[0] for line in on_the_cpu[:4]] == [
        f"rank 0 step {step}" for step in range(4)
    ]
    assert on_the_cpu[4:5] == ["exit codes [0]"]
    assert on_the_cpu[-1].startswith("weights trained ")


@pytest.mark.parametrize(
    ("style", "start"),
    [
        ("cuda", "fork"),
        pytest.param(
            "accelerator",
            "spawn",
            marks=pytest.mark.skipif(
                not hasattr(torch, "accelerator"), reason="torch.accelerator is torch >= 2.6"
            ),
        ),
    ],
)
def test_workers_taking_turns_read_each_others_steps(style: str, start: str) -> None:
    options = ["--style", style, "--cuda", "--start", start, "--num-processes", "2", "--lockstep"]
    on_the_cpu, _ = _compare_with_the_cpu(options)
    steps = [line.split(" loss ")[0] for line in on_the_cpu if line.startswith("rank")]
    assert steps == [f"rank {rank} step {step}" for step in range(4) for rank in (0, 1)]


def test_workers_running_freely_train_the_parents_model() -> None:
    options = ["--cuda", "--start", "spawn", "--num-processes", "2"]
    for result in (_run(options), _run(options, "-m", "dmlpatch", "--device", "sim")):
        lines = _training(result)
        steps = sorted(line.split(" loss ")[0] for line in lines if line.startswith("rank"))
        assert steps == sorted(f"rank {rank} step {step}" for rank in (0, 1) for step in range(4))
        assert "exit codes [0, 0]" in lines
        assert lines[-1].startswith("weights trained ")


def test_under_device_cpu_nothing_changes() -> None:
    options = ["--cuda", "--start", "spawn", "--num-processes", "1"]
    plain = _run(options)
    on_cpu = _run(options, "-m", "dmlpatch", "--device", "cpu")
    assert _training(on_cpu) == _training(plain)
    assert "parent computed on cpu" in on_cpu.out
    assert not [line for line in on_cpu.err_lines if "share_memory" in line]
