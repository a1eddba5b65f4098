"""The CUDA API a program calls once it has its device, in a user's project on DirectML.

The project's helper module is the corpus's ``cuda_api.py``: device properties and memory
statistics (yolov5's ``select_device``), ``Event``/``Stream`` timing, ``torch.cuda.device(i)``,
legacy ``torch.cuda.FloatTensor`` types with ``x.type(Tensor)``, an AMP training loop with
``autocast`` and ``GradScaler``, and ``torch.accelerator``. Under plain python on this machine
(no CUDA) it takes its CPU branches; under the runner and under activation on the simulated
device it takes its CUDA branches, which fail without dmlpatch (``Found no NVIDIA driver``),
and gives the CPU's numbers (the AMP loop's within float16's rounding: it runs in float16
there, and in float32 on the CPU, whose CUDA autocast is off).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import REPO, clean_env, linked_venv, run_python

MAIN = """
import json
from helpers import gpu

print(json.dumps(gpu.run()))
"""

AMP_LINE = (
    "dmlpatch: mixed precision: autocast computes in float16 on privateuseone:0 with CUDA's "
    "operator lists"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    shutil.copy(REPO / "tests" / "corpus" / "cuda_api.py", tmp_path / "helpers" / "gpu.py")
    (tmp_path / "train.py").write_text(MAIN)
    return tmp_path


@pytest.fixture(scope="module")
def venv() -> Iterator[tuple[str, Path]]:
    yield from linked_venv()


#: What the device holds when ``describe`` asks (the peak was reset just before): the model's
#: parameters (Linear(3, 8) and Linear(8, 1): 41 floats) and the timed output (4 floats), with
#: what its graph saves for backward: the input (12 floats) and tanh's output (32 floats).
HELD = (41 + 4 + 12 + 32) * 4


def _on_device_equal_to_cpu(got: dict, expected: dict) -> None:
    assert expected["describe"] == {"device": "cpu"}
    assert got["describe"] == {
        "name": "Simulated Radeon (discrete)",
        "memory_mib": 8192.0,
        "capability": [0, 0],
        "bf16": False,
        "allocated": HELD,
        "peak": HELD,
        "free_total": [8 * 2**30 - HELD, 8 * 2**30],
    }
    for row, expected_row in zip(got["timed"], expected["timed"]):
        assert row == pytest.approx(expected_row, rel=1e-5, abs=1e-6)
    assert got["elapsed_ok"] is True
    legacy, cpu_legacy = got["legacy"], expected["legacy"]
    assert legacy.pop("is_cuda_float") is True and cpu_legacy.pop("is_cuda_float") is None
    assert legacy == cpu_legacy
    # The AMP loop: float16 on the device, float32 on the CPU (its autocast is off there)
    assert got["amp"][:4] == pytest.approx(expected["amp"][:4], rel=5e-3)
    assert got["amp"][:4] != pytest.approx(expected["amp"][:4], rel=1e-6, abs=0)
    assert (got["amp"][4], expected["amp"][4]) == (1.0, 0.0)  # the newer GradScaler: on, off
    assert (got["accelerator"], expected["accelerator"]) == ("privateuseone:0", "cpu")
    assert got["oom_is_class"] is True


def test_runner_answers_the_cuda_api_on_the_device(project: Path) -> None:
    plain = run_python(["train.py"], cwd=project)
    assert plain.code == 0, plain.err
    patched = run_python(["-m", "dmlpatch", "--device", "sim", "train.py"], cwd=project)
    assert patched.code == 0, patched.err
    _on_device_equal_to_cpu(json.loads(patched.out), json.loads(plain.out))
    assert patched.err_lines.count(AMP_LINE) == 1
    assert "running on privateuseone:0" in patched.err


def test_activation_answers_the_cuda_api_on_the_device(
    project: Path, venv: tuple[str, Path]
) -> None:
    python, _ = venv
    expected = json.loads(run_python(["train.py"], cwd=project, python=python).out)
    activated = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
    assert activated.code == 0, activated.err
    try:
        result = run_python(["train.py"], cwd=project, python=python)
    finally:
        run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert result.code == 0, result.err
    _on_device_equal_to_cpu(json.loads(result.out), expected)
    assert result.err_lines.count(AMP_LINE) == 1


def test_without_dmlpatch_the_cuda_branches_fail_on_directml(project: Path) -> None:
    """What a user meets with torch-directml alone, the device line edited by hand: the
    CUDA API behind it has no NVIDIA driver to talk to."""
    gpu = project / "helpers" / "gpu.py"
    source = gpu.read_text()
    edited = source.replace("cuda = torch.cuda.is_available()", "cuda = True").replace(
        'torch.device("cuda:0" if cuda else "cpu")', "dmlpatch.sim.device(0)"
    )
    gpu.write_text("import dmlpatch.sim\ndmlpatch.sim.load()\n" + edited)
    result = run_python(["train.py"], cwd=project, env=clean_env())
    assert result.code == 1
    # The first CUDA object, the timing loop's stream (torch 2.4 raises RuntimeError, later
    # releases torch.AcceleratorError, with the same text).
    assert "in timed\n    side = torch.cuda.Stream()" in result.err
    assert "CUDA error: CUDA driver version is insufficient for CUDA runtime version" in result.err


TRAIN_STEP = """
import json

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to(device)
optimizer = torch.optim.Adam(model.parameters())
torch.cuda.reset_peak_memory_stats()
start = torch.cuda.memory_allocated()


def train_step() -> None:
    x = torch.randn(512, 256, device=device)
    model(x).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


train_step()
figures = {
    "start": start,
    "end": torch.cuda.memory_allocated(),
    "peak": torch.cuda.max_memory_allocated(),
    "stats_peak": torch.cuda.memory_stats()["allocated_bytes.all.peak"],
}
torch.cuda.reset_peak_memory_stats()
figures["after_reset"] = torch.cuda.max_memory_allocated()
print(json.dumps(figures))
"""


def test_the_peak_after_a_training_step_is_the_step_s_true_one(tmp_path: Path) -> None:
    """The program asks only once the step is over; the peak is still what the step held."""
    (tmp_path / "train.py").write_text(TRAIN_STEP)
    result = run_python(["-m", "dmlpatch", "--device", "sim", "train.py"], cwd=tmp_path)
    assert result.code == 0, result.err
    figures = json.loads(result.out)
    parameters = (256 * 1024 + 1024 + 1024 * 256 + 256) * 4
    assert figures["start"] == parameters
    assert figures["end"] == 3 * parameters  # with Adam's two moments; gradients set to None
    # At the optimizer step: parameters, gradients, both moments, and the step's input.
    assert figures["peak"] >= 4 * parameters + 512 * 256 * 4
    assert figures["stats_peak"] == figures["peak"]
    assert figures["after_reset"] == figures["end"]
