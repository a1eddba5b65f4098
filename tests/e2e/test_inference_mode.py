"""``torch.inference_mode`` in a user's project on DirectML: without dmlpatch its kernels refuse
the model's parameters inside it (microsoft/DirectML#602); under the runner and under
activation the same project runs on the device, equal to a plain CPU run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import clean_env, linked_venv, run_python

MAIN = """
import json, torch
from helpers.infer import classify, Net

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = Net().eval().to(device)
batch = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
with torch.inference_mode():
    logits = model(batch.to(device))
labels = classify(model, batch, device)
print(json.dumps({
    "device": str(next(model.parameters()).device),
    "logits": logits.cpu().tolist(),
    "labels": labels,
}))
"""

# No "cuda" anywhere in this module: it is rewritten for its inference_mode alone.
INFER = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(8 * 8 * 8, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


@torch.inference_mode()
def classify(model, batch, device):
    return model(batch.to(device)).argmax(1).tolist()
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "infer.py").write_text(INFER)
    (tmp_path / "predict.py").write_text(MAIN)
    return tmp_path


@pytest.fixture(scope="module")
def venv() -> Iterator[tuple[str, Path]]:
    yield from linked_venv()


def _close(got: dict, expected: dict) -> None:
    assert got["labels"] == expected["labels"]
    for row, expected_row in zip(got["logits"], expected["logits"]):
        assert row == pytest.approx(expected_row, rel=1e-5, abs=1e-6)


def test_runner_runs_inference_mode_on_the_device(project: Path) -> None:
    plain = run_python(["predict.py"], cwd=project)
    assert plain.code == 0, plain.err
    patched = run_python(["-m", "dmlpatch", "--device", "sim", "predict.py"], cwd=project)
    assert patched.code == 0, patched.err
    expected, got = json.loads(plain.out), json.loads(patched.out)
    assert expected["device"] == "cpu" and got["device"] == "privateuseone:0"
    _close(got, expected)
    assert "running on privateuseone:0" in patched.err


def test_activation_runs_inference_mode_on_the_device(
    project: Path, venv: tuple[str, Path]
) -> None:
    python, _ = venv
    expected = json.loads(run_python(["predict.py"], cwd=project, python=python).out)
    activated = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
    assert activated.code == 0, activated.err
    try:
        result = run_python(["predict.py"], cwd=project, python=python)
    finally:
        run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert result.code == 0, result.err
    got = json.loads(result.out)
    assert got["device"] == "privateuseone:0"
    _close(got, expected)


def test_the_same_project_fails_on_directml_without_the_rewrite(project: Path) -> None:
    # What a user meets with torch-directml alone: the project's own device line edited by
    # hand to the DirectML device, nothing else (here the simulated device, loaded directly).
    source = (project / "predict.py").read_text()
    edited = source.replace(
        'torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        "dmlpatch.sim.device(0)",
    )
    (project / "by_hand.py").write_text("import dmlpatch.sim\ndmlpatch.sim.load()\n" + edited)
    result = run_python(["by_hand.py"], cwd=project, env=clean_env())
    assert result.code == 1
    assert result.err.strip().splitlines()[-1] == (
        "RuntimeError: Cannot set version_counter for inference tensor"
    )
