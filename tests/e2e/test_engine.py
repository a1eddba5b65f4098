"""Specs → hook + wrappers, end to end through ``python -m dmlpatch`` on a real (fake-installed)
distribution; reports; version gates; child processes (subprocess, spawn, DataLoader workers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import clean_env, run_python

LIBRARY = {
    "fakelib/__init__.py": "",
    "fakelib/models.py": """
        import torch


        class Model:
            def __init__(self, device=None):
                self.device = torch.device('cuda' if torch.cuda.is_available() else 'cpu') \\
                    if device is None else device


        def init_model(name, device='cuda'):
            return name, device


        def patched():
            return '__dmlpatch__' in globals()
        """,
    "fakelib/fixes.py": """
        def device_to_cpu(wrapped, instance, args, kwargs):
            kwargs['device'] = 'cpu-by-fix'
            return wrapped(*args, **kwargs)
        """,
}

SPEC = """
[package]
name = "fakelib"
versions = "{versions}"
[[rewrite]]
modules = ["fakelib.models"]
expect_sites = {expect}
why = "Model picks its own device"
[[wrap]]
target = "fakelib.models:init_model"
fix = "fakelib.fixes:device_to_cpu"
why = "default device='cuda'"
"""


@pytest.fixture
def setup(tmp_path: Path, fake_distribution):
    def make(version: str = "1.0", versions: str = ">=1,<2", expect: int = 3) -> dict[str, str]:
        site = fake_distribution("fakelib", version, LIBRARY)
        specs = tmp_path / "specs"
        specs.mkdir()
        (specs / "fakelib.toml").write_text(SPEC.format(versions=versions, expect=expect))
        return clean_env(PYTHONPATH=str(site), DMLPATCH_PATCHES=str(specs))

    return make


PROGRAM = """
import sys
from fakelib import models
print(models.patched(), models.Model().device, models.init_model('m'))
"""


def test_target_is_rewritten_and_wrapped_and_reported(tmp_path: Path, setup) -> None:
    env = setup()
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    report_path = tmp_path / "report.json"
    result = run_python(
        ["-m", "dmlpatch", "--device", "cpu", f"--report={report_path}", str(script)], env=env
    )
    assert result.code == 0, result.err
    assert result.out == "True cpu ('m', 'cpu-by-fix')\n"
    report = json.loads(report_path.read_text())
    assert report["device"] == "cpu"
    assert report["backend"] == "cpu"
    assert report["patches"]["fakelib"]["modules"] == [
        {"module": "fakelib.models", "sites": 3, "cached": False}
    ]
    assert report["patches"]["fakelib"]["functions"] == ["fakelib.models:init_model"]


def test_version_outside_range_warns_once_and_runs_unpatched(tmp_path: Path, setup) -> None:
    env = setup(version="2.1")
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    result = run_python(["-m", "dmlpatch", "--device", "cpu", str(script)], env=env)
    assert result.code == 0, result.err
    assert result.out == "False cpu ('m', 'cuda')\n"
    warnings = [line for line in result.err_lines if "warning" in line]
    assert warnings == [
        "dmlpatch: warning: patch spec 'fakelib' is for fakelib <2,>=1, but 2.1 is installed; "
        "fakelib runs unpatched"
    ]


def test_stale_spec_leaves_module_alone(tmp_path: Path, setup) -> None:
    env = setup(expect=5)
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    result = run_python(["-m", "dmlpatch", "--device", "cpu", str(script)], env=env)
    assert result.code == 0, result.err
    assert result.out.startswith("False cpu")
    warnings = [line for line in result.err_lines if "warning" in line]
    assert warnings == [
        "dmlpatch: warning: patch spec 'fakelib' expects 5 CUDA site(s) in fakelib.models but "
        "found 3; the module runs unrewritten (is the installed version newer than the spec? "
        "update the spec or report it)"
    ]


def test_malformed_spec_is_one_line_exit_2(tmp_path: Path, setup) -> None:
    env = setup()
    (Path(env["DMLPATCH_PATCHES"]) / "broken.toml").write_text("[package]\nname = 1\n")
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    result = run_python(["-m", "dmlpatch", "--device", "cpu", str(script)], env=env)
    assert result.code == 2
    assert result.err_lines[-1].startswith("dmlpatch: error: patch spec ")
    assert "broken.toml: field 'package.name'" in result.err_lines[-1]
    assert result.out == ""


def test_import_dmlpatch_auto(tmp_path: Path, setup) -> None:
    env = setup()
    env["DMLPATCH_DEVICE"] = "cpu"
    script = tmp_path / "program.py"
    script.write_text("import dmlpatch.auto\n" + PROGRAM)
    result = run_python([str(script)], env=env)
    assert result.code == 0, result.err
    assert result.out == "True cpu ('m', 'cpu-by-fix')\n"


CHILDREN = """
import multiprocessing as mp
import subprocess
import sys

import torch
from torch.utils.data import DataLoader, Dataset


def probe(_=None):
    import os
    from fakelib import models
    return (models.patched(), os.environ.get("DMLPATCH_DEVICE"))


class Probe(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return torch.tensor([int(probe()[0])])


if __name__ == "__main__":
    code = "from fakelib import models; print(models.patched())"
    print("subprocess", subprocess.run([sys.executable, "-c", code],
                                       capture_output=True, text=True).stdout.strip())
    with mp.get_context("spawn").Pool(2) as pool:
        print("spawn", pool.map(probe, range(2)))
    loader = DataLoader(Probe(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    print("dataloader", [batch.flatten().tolist() for batch in loader])
"""


def test_children_start_patched(tmp_path: Path, setup) -> None:
    env = setup()
    script = tmp_path / "children.py"
    script.write_text(CHILDREN)
    result = run_python(["-m", "dmlpatch", "--device", "cpu", str(script)], env=env)
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "subprocess True",
        "spawn [(True, 'cpu'), (True, 'cpu')]",
        "dataloader [[1, 1], [1, 1]]",
    ]


def test_children_keep_an_existing_sitecustomize(tmp_path: Path, setup) -> None:
    env = setup()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS = 'loaded'\n")
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{theirs}"
    script = tmp_path / "p.py"
    script.write_text(
        "import subprocess, sys\n"
        "code = 'import builtins; from fakelib import models; "
        "print(builtins.THEIRS, models.patched())'\n"
        "print(subprocess.run([sys.executable, '-c', code], capture_output=True, "
        "text=True).stdout.strip())\n"
    )
    result = run_python(["-m", "dmlpatch", "--device", "cpu", str(script)], env=env)
    assert result.code == 0, result.err
    assert result.out == "loaded True\n"


def test_alias_only_where_the_module_is_missing(tmp_path: Path, setup) -> None:
    env = setup()
    spec_file = Path(env["DMLPATCH_PATCHES"]) / "fakelib.toml"
    spec_file.write_text(
        spec_file.read_text()
        + '[[alias]]\nmodule = "fakelib.legacy"\ntarget = "fakelib.models"\nwhy = "renamed"\n'
        + '[[alias]]\nmodule = "fakelib.fixes"\ntarget = "fakelib.models"\nwhy = "exists"\n'
    )
    script = tmp_path / "p.py"
    script.write_text(
        "import fakelib.legacy, fakelib.fixes, fakelib.models\n"
        "print(fakelib.legacy is fakelib.models, fakelib.fixes is fakelib.models)\n"
    )
    result = run_python(["-m", "dmlpatch", "--device", "cpu", "--report", str(script)], env=env)
    assert result.code == 0, result.err
    assert result.out == "True False\n"
    report = json.loads(result.err[result.err.index("{") :])
    assert report["patches"]["fakelib"]["aliases"] == [
        {"alias": "fakelib.legacy", "module": "fakelib.models"}
    ]
    plain = run_python([str(script)], env=env)
    assert plain.code == 1 and "No module named 'fakelib.legacy'" in plain.err


def test_run_console_script_with_patches(tmp_path: Path, setup) -> None:
    env = setup()
    site = Path(env["PYTHONPATH"])
    info = next(site.glob("fakelib-*.dist-info"))
    (info / "entry_points.txt").write_text("[console_scripts]\nfaketool = fakelib.cli:main\n")
    (site / "fakelib" / "cli.py").write_text(
        "import sys\n"
        "def main():\n"
        "    from fakelib import models\n"
        "    print(sys.argv, models.patched(), models.Model().device)\n"
        "    return 4\n"
    )
    result = run_python(
        ["-m", "dmlpatch", "run", "--device", "sim", "faketool", "a", "-b"], env=env
    )
    assert result.code == 4, result.err
    assert result.out == "['faketool', 'a', '-b'] True privateuseone:0\n"


def test_cuda_method_calls_land_on_the_target(tmp_path: Path) -> None:
    """Tensors, modules and storages (basicsr's resume path: ``storage.cuda(device_id)``)."""
    script = tmp_path / "p.py"
    script.write_text(
        "import torch\n"
        "storage = torch.arange(4.0).untyped_storage().cuda(0)\n"
        "tensor = torch.ones(2).cuda(non_blocking=True)\n"
        "module = torch.nn.Linear(2, 2).cuda()\n"
        "print(storage.device, tensor.device, module.weight.device)\n"
    )
    result = run_python(["-m", "dmlpatch", "--device", "sim", str(script)])
    assert result.code == 0, result.err
    assert result.out == "privateuseone:0 privateuseone:0 privateuseone:0\n"
