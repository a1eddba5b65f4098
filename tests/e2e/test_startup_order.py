"""The program starts first: no entry point imports torch before the program does.

Settings a program makes before its own ``import torch`` (thread counts, visible devices, the
default dtype) must hold under dmlpatch as they do under plain python, and a program that never
imports torch must not pay for it.
"""

from __future__ import annotations

import importlib.machinery
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Result, clean_env, linked_venv, run_python

# What the program sees of torch before and after its own settings.
SETTINGS_FIRST = """\
import os, sys
print("torch before the program:", "torch" in sys.modules)
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch
torch.set_default_dtype(torch.float64)
print("threads:", torch.get_num_threads())
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(3, 2).to(device)
print("dtype:", model.weight.dtype)
"""

NO_TORCH = """\
import sys
print("torch imported:", any(name == "torch" or name.startswith("torch.") for name in sys.modules))
"""

RUNNER_SPECS = [None, "auto", "sim", "cpu"]


def _program(tmp_path: Path, source: str, name: str = "program.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def _runner(script: Path, device: str | None, *extra: str, **env: str) -> Result:
    options = ["--device", device] if device else []
    return run_python(
        ["-m", "dmlpatch", *options, *extra, script.name], cwd=script.parent, env=clean_env(**env)
    )


@pytest.mark.parametrize("device", RUNNER_SPECS, ids=lambda d: d or "default")
def test_settings_before_import_torch_hold_under_the_runner(tmp_path: Path, device: str) -> None:
    script = _program(tmp_path, SETTINGS_FIRST)
    plain = run_python([script.name], cwd=tmp_path)
    assert plain.code == 0, plain.err
    assert plain.out == "torch before the program: False\nthreads: 1\ndtype: torch.float64\n"
    patched = _runner(script, device)
    assert patched.code == 0, patched.err
    assert patched.out == plain.out


def test_settings_hold_under_auto(tmp_path: Path) -> None:
    script = _program(tmp_path, "import dmlpatch.auto\n" + SETTINGS_FIRST)
    for device in ("auto", "sim"):
        result = run_python([script.name], cwd=tmp_path, env=clean_env(DMLPATCH_DEVICE=device))
        assert result.code == 0, result.err
        assert result.out == "torch before the program: False\nthreads: 1\ndtype: torch.float64\n"


@pytest.fixture(scope="module")
def activated_venv() -> Iterator[str]:
    for python, _purelib in linked_venv():
        result = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
        assert result.code == 0, result.err
        yield python


def test_settings_hold_under_activation(activated_venv: str, tmp_path: Path) -> None:
    script = _program(tmp_path, SETTINGS_FIRST)
    result = run_python([script.name], cwd=tmp_path, python=activated_venv)
    assert result.code == 0, result.err
    assert result.out == "torch before the program: False\nthreads: 1\ndtype: torch.float64\n"


def test_an_activated_process_without_torch_never_imports_it(
    activated_venv: str, tmp_path: Path
) -> None:
    script = _program(tmp_path, NO_TORCH)
    result = run_python(["-X", "importtime", script.name], cwd=tmp_path, python=activated_venv)
    assert result.code == 0, result.err
    assert result.out == "torch imported: False\n"
    assert "dmlpatch.startup.bootstrap" in result.err  # the .pth did start dmlpatch
    assert not [line for line in result.err.splitlines() if line.rstrip().endswith("| torch")]


@pytest.mark.parametrize("device", [None, "sim", "dml", "cpu"], ids=lambda d: d or "default")
def test_a_program_without_torch_runs_without_torch(tmp_path: Path, device: str) -> None:
    script = _program(tmp_path, NO_TORCH)
    # Asked of the path, as the child sees it: this worker may hold the simulator's blocker.
    if device == "dml" and importlib.machinery.PathFinder.find_spec("torch_directml") is None:
        # torch-directml is not installed: that is known without torch, before the program.
        # (Where it is installed, only importing it tells whether it works, and a program that
        # never imports torch runs as the other devices' do: .ci/compat's venv.)
        result = _runner(script, device)
        assert result.code == 2
        assert result.err_lines == [
            "dmlpatch: error: DirectML unavailable: torch-directml is not installed "
            "(pip install torch-directml; Windows or WSL2)"
        ]
        assert result.out == ""
        return
    result = _runner(script, device, **{"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.code == 0, result.err
    assert result.out == "torch imported: False\n"
    imported = [line.rpartition("|")[2].strip() for line in result.err.splitlines()]
    assert "dmlpatch.specs.engine" in imported  # patches were installed
    assert not [name for name in imported if name == "torch" or name.startswith("torch.")]
    # Nor the op fixes (they come with torch): checking --bf16 must not load them.
    assert not [name for name in imported if name.startswith("dmlpatch.opfix")]


def test_auto_without_torch_never_imports_it(tmp_path: Path) -> None:
    script = _program(tmp_path, "import dmlpatch.auto\n" + NO_TORCH)
    result = run_python([script.name], cwd=tmp_path)
    assert result.code == 0, result.err
    assert result.out == "torch imported: False\n"


def test_a_console_script_without_torch_runs_without_torch() -> None:
    result = run_python(["-X", "importtime", "-m", "dmlpatch", "run", "pip", "--version"])
    assert result.code == 0, result.err
    assert result.out.startswith("pip ")
    assert not [line for line in result.err.splitlines() if line.rstrip().endswith("| torch")]


def test_a_check_that_needs_torch_stops_at_its_import(tmp_path: Path) -> None:
    """CUDA's absence shows only through torch: the program runs up to its import of torch."""
    script = _program(tmp_path, "print('before torch', flush=True)\nimport torch\nprint('after')\n")
    result = _runner(script, "cuda")
    assert result.code == 2
    assert result.out == "before torch\n"
    assert result.err_lines == [
        "dmlpatch: error: CUDA unavailable: CUDA unavailable (no CUDA GPU found)"
    ] or result.err_lines == [
        "dmlpatch: error: CUDA unavailable: CUDA unavailable (a CPU-only torch build)"
    ]


def test_the_device_line_waits_for_the_device(tmp_path: Path) -> None:
    """ "running on" is said when a CUDA site first hands out the device, and only then."""
    uses = _program(
        tmp_path,
        "import sys, torch\n"
        "print('imported', flush=True)\n"
        "sys.stderr.write('program: before the device\\n'); sys.stderr.flush()\n"
        "x = torch.ones(2).cuda()\n"
        "print(x.device)\n",
        "uses.py",
    )
    result = _runner(uses, "sim")
    assert result.code == 0, result.err
    assert result.out == "imported\nprivateuseone:0\n"
    assert result.err_lines[0] == "program: before the device"
    assert result.err_lines[1].startswith(
        "dmlpatch: running on privateuseone:0 (Simulated Radeon (discrete)): requested sim"
    )

    never = _program(tmp_path, "import torch\nprint(torch.ones(2).device)\n", "never.py")
    result = _runner(never, "sim")
    assert result.code == 0, result.err
    assert result.out == "cpu\n"
    assert not [line for line in result.err_lines if "running on" in line]
