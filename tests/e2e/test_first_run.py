"""The first run after a library is installed or upgraded says why it is slow: dmlpatch
examines and rewrites the library's modules once, then reads them from its caches. A run that
spends a second on it says so in one line; the next run, from the cache, says nothing. Where
python writes no bytecode (PYTHONDONTWRITEBYTECODE), every run prepares again, and the line
says that instead."""

from __future__ import annotations

import re
from pathlib import Path

from support import FIRST_RUN, clean_env, run_python

# A library of many modules with CUDA sites: rewriting and compiling them takes seconds, also
# without examining them first (a warm discovery index), on a fast machine.
MODULE = """
import torch


def place_{index}(x):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return x.to(device) + {index}
""" + "".join(
    f"\n\ndef helper_{{index}}_{n}(x):\n    return x * {n} + torch.zeros(1, device='cuda')\n"
    for n in range(60)
)


def _library(root: Path, modules: int) -> Path:
    package = root / "site" / "bulky"
    package.mkdir(parents=True)
    names = [f"part{index}" for index in range(modules)]
    (package / "__init__.py").write_text(
        "".join(f"from bulky import {name}\n" for name in names), encoding="utf-8"
    )
    for index, name in enumerate(names):
        (package / f"{name}.py").write_text(MODULE.format(index=index), encoding="utf-8")
    (root / "program.py").write_text("import torch, bulky\nprint('imported')\n")
    return root / "site"


def _run(root: Path, site: Path, program: str = "program.py", **env: str) -> list[str]:
    result = run_python(
        ["-m", "dmlpatch", "--device", "cpu", program],
        cwd=root,
        env=clean_env(PYTHONPATH=str(site), DMLPATCH_CACHE_DIR=str(root / "cache"), **env),
        timeout=600,
    )
    assert result.code == 0 and result.out == "imported\n", result.err
    return [line for line in result.err.splitlines() if FIRST_RUN.search(line)]


def _prepared_torch(root: Path, site: Path, **env: str) -> None:
    """torch's own first run in this cache (numpy, pynvml... examined once): on a slow machine
    they alone take a second, and the line would name them instead of the library here."""
    (root / "torch_only.py").write_text("import torch\nprint('imported')\n")
    _run(root, site, "torch_only.py", **env)


def _named(line: str) -> list[str]:
    """The libraries a first-run line names, costliest first."""
    found = re.search(
        r"(?:upgrading|preparing) (.+?) (?:\(or dmlpatch\))?(?:: |for DirectML)", line
    )
    assert found is not None, line
    return found.group(1).split(", ")


def test_the_first_run_says_it_prepares_and_the_next_says_nothing(tmp_path: Path) -> None:
    site = _library(tmp_path, 500)
    _prepared_torch(tmp_path, site, PYTHONDONTWRITEBYTECODE="")
    first = _run(tmp_path, site, PYTHONDONTWRITEBYTECODE="")
    assert len(first) == 1, first
    assert first[0].startswith("dmlpatch: first run after installing or upgrading ")
    assert _named(first[0])[0] == "bulky", first[0]
    assert "preparing them for DirectML, once (" in first[0]
    assert first[0].endswith("later runs start from the cache")
    assert _run(tmp_path, site, PYTHONDONTWRITEBYTECODE="") == []


def test_without_bytecode_every_run_says_it_prepares_again(tmp_path: Path) -> None:
    site = _library(tmp_path, 500)
    _prepared_torch(tmp_path, site, PYTHONDONTWRITEBYTECODE="1")
    for _ in range(2):
        (said,) = _run(tmp_path, site, PYTHONDONTWRITEBYTECODE="1")
        assert said.startswith("dmlpatch: preparing ") and _named(said)[0] == "bulky", said
        assert said.endswith("so every run prepares them again")
