"""What Windows users meet that can be exercised on this Linux machine: Windows paths in what
they type and in what dmlpatch writes, pip's Windows file names, and programs under paths with
spaces whose children start by spawn (Windows' only start method). What is checked only by
reading is listed in the documentation's "Windows specifics" section
(docs/guide/install.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dmlpatch.pinning import pip_config
from dmlpatch.startup import activation, pth_line, runner

from support import run_python


@pytest.mark.parametrize(
    "typed",
    [
        "yolo",
        r"C:\Users\Ana Lima\dml-env\Scripts\yolo.exe",
        r"C:\Users\Ana Lima\dml-env\Scripts\yolo",
        "yolo.EXE",
        "/home/ana/dml-env/bin/yolo",
    ],
)
def test_a_console_script_as_typed_on_windows_is_found(typed: str) -> None:
    entry_point = runner.find_console_script(typed)
    assert (entry_point.name, entry_point.value) == ("yolo", "ultralytics.cfg:entrypoint")


def test_an_activation_line_with_a_windows_path_is_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line stores paths as Python literals: backslashes, spaces and quotes survive."""
    monkeypatch.setattr(activation, "site_packages", lambda: tmp_path)
    guard = r"C:\Users\O'Neil Ray\dml env\Lib\site-packages\dmlpatch\startup\bootstrap.py"
    line = pth_line.line(guard, activation.TARGET, "dml:1")
    activation.pth_path().write_text(line, encoding="utf-8")
    assert activation.configured_device() == "dml:1"
    assert (
        activation.stale() == f"names {guard}, which does not exist (written by another "
        "dmlpatch installation)"
    )


def test_pips_windows_names() -> None:
    assert pip_config.site_file_name("win32") == "pip.ini"
    assert pip_config.site_file_name("linux") == "pip.conf"
    url = "file:///C:/Users/Ana%20Lima/dml-env/dmlpatch-pin/constraints.txt"
    assert pip_config.url_path(url, windows=True) == (
        "C:/Users/Ana Lima/dml-env/dmlpatch-pin/constraints.txt"
    )
    assert pip_config.url_path("file:///home/ana/c.txt", windows=False) == "/home/ana/c.txt"


SPAWNING = """
import json, multiprocessing, sys

import torch


def where(_):
    import dmlpatch.startup.bootstrap as bootstrap
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return [bootstrap.started(), str(torch.zeros(1, device=device).device)]


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.map(where, [0])[0]
    print(json.dumps({"argv": sys.argv[1:], "child": child}))
"""


def test_a_program_under_a_path_with_spaces_and_its_spawn_children(tmp_path: Path) -> None:
    home = tmp_path / "My Projects (v2)" / "dml run"
    home.mkdir(parents=True)
    script = home / "train script.py"
    script.write_text(SPAWNING, encoding="utf-8")
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", str(script), "a b", r"C:\data set"], cwd=home
    )
    assert result.code == 0, result.err
    data = json.loads(result.out.splitlines()[-1])
    assert data == {"argv": ["a b", r"C:\data set"], "child": [True, "privateuseone:0"]}
