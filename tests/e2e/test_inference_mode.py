"""``torch.inference_mode`` in a user's project on DirectML: without dmlpatch its kernels refuse
the model's parameters inside it (microsoft/DirectML#602); under the runner and under
activation the same project runs on the device, equal to a plain CPU run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import REPO, clean_env, linked_venv, run_python

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


CORPUS_DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import inference_mode
print(json.dumps(inference_mode.run()))
"""


def test_every_form_of_inference_mode_is_grad_mode_off_on_directml(tmp_path: Path) -> None:
    """The corpus of inference_mode idioms (with, decorators, bare, False, generators),
    rewritten by discovery on the simulated device: same results and grad modes as a plain
    CPU run, without inference tensors."""
    driver = tmp_path / "driver.py"
    driver.write_text(CORPUS_DRIVER)
    corpus = str(REPO / "tests" / "corpus")
    plain = run_python([str(driver), corpus], cwd=tmp_path)
    assert plain.code == 0, plain.err
    patched = run_python(["-m", "dmlpatch", "--device", "sim", str(driver), corpus], cwd=tmp_path)
    assert patched.code == 0, patched.err
    expected, got = json.loads(plain.out), json.loads(patched.out)
    assert expected.pop("inside_is_inference") is True  # torch's own inference mode
    assert got.pop("inside_is_inference") is False
    assert got == expected
    assert expected["grad_inside"] is False and expected["trains_inside"] is True


DECIDED_PER_ENTRY = """
import torch
from dmlpatch.runtime.inference import inference_mode

@inference_mode()
def made():
    return torch.ones(1).is_inference(), torch.is_grad_enabled()

before = made()  # no DirectML backend yet: torch's inference mode
import dmlpatch.sim as sim
sim.load()  # as ultralytics' device=sim does, long after the decorator ran
after = made()
with inference_mode(), inference_mode(False):
    enabled = torch.is_grad_enabled()
print(before, after, enabled)
"""


def test_inference_mode_is_decided_at_each_entry_not_when_decorating() -> None:
    result = run_python(["-c", DECIDED_PER_ENTRY])
    assert result.code == 0, result.err
    assert result.out.split() == ["(True,", "False)", "(False,", "False)", "True"]
