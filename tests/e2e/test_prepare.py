"""``dmlpatch prepare`` does a first run's preparation ahead of it: after it, the run reads every
module of the prepared library from the cache (the report says each was cached, and the
first-run line is not said), where the same run without it rewrites them all. Nothing of the
library is executed; the progress bar shows on a terminal; bad input is one line."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import FIRST_RUN, clean_env, linked_venv, run_python

MODULES = 120
MODULE = """
import torch


def place_{index}(x):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return x.to(device) + {index}
"""
#: A module with sites that stops whoever runs it: prepare must only compile it.
TRAP = """
import torch

raise SystemExit("the trap module ran")
DEVICE = torch.device("cuda")
"""


def _library(site: Path, name: str = "bulky") -> None:
    package = site / name
    (package / "deep").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "".join(f"from {name} import part{index}\n" for index in range(MODULES))
    )
    for index in range(MODULES):
        (package / f"part{index}.py").write_text(MODULE.format(index=index))
    (package / "deep" / "__init__.py").write_text("")
    (package / "deep" / "trap.py").write_text(TRAP)
    (package / "no-name").mkdir()  # not importable: not a module directory
    (package / "no-name" / "data.py").write_text("x = torch.device('cuda')\n")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    made = tmp_path / "site"
    made.mkdir()
    _library(made)
    (tmp_path / "program.py").write_text("import torch, bulky\nprint('imported')\n")
    return made


def _env(tmp_path: Path, site: Path) -> dict[str, str]:
    env = clean_env(PYTHONPATH=str(site), DMLPATCH_CACHE_DIR=str(tmp_path / "cache"))
    del env["PYTHONDONTWRITEBYTECODE"]  # the bytecode cache is written as users' pythons do
    return env


def _program(tmp_path: Path, site: Path) -> tuple[list[str], dict[str, bool]]:
    """The run's first-run lines, and whether each bulky module was read from the cache."""
    result = run_python(
        ["-m", "dmlpatch", "--device", "cpu", "--report=report.json", "program.py"],
        cwd=tmp_path,
        env=_env(tmp_path, site),
    )
    assert result.code == 0 and result.out == "imported\n", result.err
    report = json.loads((tmp_path / "report.json").read_text())
    cached = {
        entry["module"]: entry["cached"]
        for entry in report["rewritten"]
        if entry["module"].startswith("bulky")
    }
    return [line for line in result.err.splitlines() if FIRST_RUN.search(line)], cached


def test_after_prepare_the_first_run_reads_every_module_from_the_cache(
    tmp_path: Path, site: Path
) -> None:
    result = run_python(
        ["-m", "dmlpatch", "prepare", "--jobs", "2", "bulky"],
        cwd=tmp_path,
        env=_env(tmp_path, site),
    )
    assert result.code == 0, result.err
    assert result.out == ""
    assert "the trap module ran" not in result.err
    (said,) = result.err_lines
    assert re.fullmatch(
        rf"dmlpatch: prepared {MODULES + 3} modules of 1 package in \d+\.\d s with 2 processes: "
        rf"{MODULES + 1} rewritten for DirectML, the rest have no CUDA site; the next run "
        r"starts from the cache",
        said,
    ), said
    first_run, cached = _program(tmp_path, site)
    assert first_run == []
    assert len(cached) == MODULES and all(cached.values()), cached


def test_without_prepare_the_same_run_prepares_them_itself(tmp_path: Path, site: Path) -> None:
    _, cached = _program(tmp_path, site)
    assert len(cached) == MODULES and not any(cached.values())


def test_on_a_terminal_a_progress_bar_moves(tmp_path: Path, site: Path) -> None:
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "dmlpatch", "prepare", "--jobs", "2", "bulky"],
        cwd=tmp_path,
        env=_env(tmp_path, site),
        stdout=subprocess.DEVNULL,
        stderr=child,
    )
    os.close(child)
    received = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        received += chunk
    os.close(main)
    assert process.wait(timeout=300) == 0
    text = received.decode()
    bars = re.findall(r"\rdmlpatch: preparing \[([#.]{30})\] (\d+)/(\d+) modules", text)
    assert len(bars) >= 2, text  # 123 modules in chunks of 48: three steps
    assert [int(done) for _, done, _ in bars] == sorted(int(done) for _, done, _ in bars)
    assert bars[-1] == ("#" * 30, str(MODULES + 3), str(MODULES + 3))
    assert text.rstrip().splitlines()[-1].startswith("dmlpatch: prepared ")


@pytest.fixture
def venv_with_library() -> Iterator[tuple[str, Path]]:
    for python, purelib in linked_venv():
        _library(purelib, "venvlib")
        yield python, purelib


def test_without_names_it_prepares_the_environment_s_site_packages(
    tmp_path: Path, venv_with_library: tuple[str, Path]
) -> None:
    python, _ = venv_with_library
    env = clean_env(DMLPATCH_CACHE_DIR=str(tmp_path / "cache"))
    del env["PYTHONDONTWRITEBYTECODE"]
    result = run_python(["-m", "dmlpatch", "prepare"], cwd=tmp_path, env=env, python=python)
    assert result.code == 0, result.err
    # This venv's site-packages holds venvlib alone (the suite's packages are linked in by a
    # .pth, outside it): torch, never rewritten, is not walked either.
    (said,) = result.err_lines
    assert said.startswith(f"dmlpatch: prepared {MODULES + 3} modules of 1 package in "), said


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (
            ["nosuchpackage"],
            "dmlpatch: error: dmlpatch prepare: no package 'nosuchpackage' in this environment",
        ),
        (
            ["torch"],
            "dmlpatch: error: dmlpatch prepare: torch is never rewritten by dmlpatch: "
            "nothing to prepare",
        ),
        (
            ["--jobs", "0", "bulky"],
            "dmlpatch: error: dmlpatch prepare: --jobs needs a number of processes, 1 or more",
        ),
        (
            ["--jobs", "many"],
            "dmlpatch: error: dmlpatch prepare: argument --jobs: invalid int value: 'many'",
        ),
        (["-x"], "dmlpatch: error: dmlpatch prepare: unexpected '-x'; see dmlpatch prepare --help"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, site: Path, arguments: list[str], said: str) -> None:
    result = run_python(
        ["-m", "dmlpatch", "prepare", *arguments], cwd=tmp_path, env=_env(tmp_path, site)
    )
    assert (result.code, result.out, result.err_lines) == (2, "", [said])
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.idx"))
