"""The report's page (docs/reference/report.md) lists every field a run writes, and a run writes
every field it lists: a program that takes each road into the report (a spec's rewrite, fix,
alias and stale module, a module kept as written, CPU fallbacks, a CPU layer with its likely
cause, a fix on the device, an autocast region) runs on the simulated device, as an ordinary
run and under ``dmlpatch check --html --report`` (the page's per-line ``compute.lines``), and
the fields of both reports are compared with the page's table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from support import REPO, clean_env, run_python

PAGE = REPO / "docs" / "reference" / "report.md"
#: A row of the page's table of fields: | `compute.cpu_lines[].at` | meaning |
_ROW = re.compile(r"^\| `(?P<field>[^`]+)` \|", re.MULTILINE)
_ITEM = "[]"

LIBRARY = {
    "mypkg/__init__.py": "",
    "mypkg/core.py": """
        import torch


        def pick():
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        """,
    "mypkg/fixes.py": """
        def as_it_is(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)
        """,
    "mypkg/stale.py": """
        import torch

        where = "cuda" if torch.cuda.is_available() else "cpu"
        """,
}

SPEC = """
[package]
name = "mypkg"
versions = ">=1"
why = "the program's library"

[[rewrite]]
modules = ["mypkg.core"]
expect_sites = 2
why = "it picks CUDA"

[[rewrite]]
modules = ["mypkg.stale"]
expect_sites = 5
why = "a spec older than its module: skipped"

[[wrap]]
target = "mypkg.core:pick"
fix = "mypkg.fixes:as_it_is"
why = "a fix"

[[alias]]
module = "mypkg.old"
target = "mypkg.core"
why = "its old name"
"""

KERNEL = """
import torch


def kernel():
    if torch.cuda.is_available():
        return torch.cuda.jiterator._create_jit_fn("template <typename T> T f(T x) {}")
    return "cpu"
"""

PROGRAM = """
import torch
from torch import nn

import gpukernel
import mypkg.old
import mypkg.stale
from mypkg import core

device = core.pick()
model = nn.Sequential(
    nn.Conv2d(3, 8, 3), nn.ReplicationPad2d(1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10)
).to(device)
head = nn.Linear(10, 4096)  # left on the CPU
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 3, 16, 16, device=device)
with torch.autocast(device.type):
    # an autocast region of its own (ReplicationPad2d has no float16 CPU kernel on torch 2.4)
    scale = (x.flatten(1)[:, :8] @ torch.ones(8, 1, device=device)).float().mean()
loss = head(model(x).cpu()).square().mean() + torch.histc(x, 10).max().cpu() + 0 * scale.cpu()
loss.backward()
optimizer.step()
print(gpukernel.kernel() is not None, mypkg.old.pick is core.pick, mypkg.stale.where)
"""

#: A suite run under pytest: its report's ``compute.tests``, with one test that warns.
SUITE = """
import pytest
import torch


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_on_either(device):
    layer = torch.nn.Linear(4, 4).to(device)
    assert layer(torch.randn(2, 4, device=device)).shape == (2, 4)


@pytest.mark.parametrize("device", ["cuda"])
def test_asks_for_cuda_and_stays_on_the_cpu(device):
    assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).shape == (2, 4)
"""

Keys = tuple[str, ...]


def documented() -> list[Keys]:
    """The fields the page's table lists, each as its keys (``<name>``: any key)."""
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("\n## Fields\n") :]
    return [_keys(match.group("field")) for match in _ROW.finditer(table)]


def _keys(field: str) -> Keys:
    keys: list[str] = []
    for part in field.split("."):
        name, items = part, 0
        while name.endswith(_ITEM):
            name, items = name[: -len(_ITEM)], items + 1
        keys += [name] + [_ITEM] * items
    return tuple(keys)


def written(data: Any, path: Keys = ()) -> set[Keys]:
    """Every field ``data`` holds, at any depth, as its keys (a list's items under ``[]``)."""
    found: set[Keys] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            found.add((*path, key))
            found |= written(value, (*path, key))
    elif isinstance(data, list):
        for item in data:
            found |= written(item, (*path, _ITEM))
    return found


def _matches(field: Keys, pattern: Keys) -> bool:
    return len(field) == len(pattern) and all(
        want == got or (want.startswith("<") and want.endswith(">") and got != _ITEM)
        for want, got in zip(pattern, field)
    )


def _shown(field: Keys) -> str:
    return ".".join(field).replace(f".{_ITEM}", _ITEM)


def _reports(tmp_path: Path, fake_distribution: Callable[..., Path]) -> list[dict[str, Any]]:
    site = fake_distribution("mypkg", "1.0", LIBRARY)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "mypkg.toml").write_text(SPEC, encoding="utf-8")
    program = tmp_path / "program"
    program.mkdir()
    (program / "gpukernel.py").write_text(KERNEL.lstrip("\n"), encoding="utf-8")
    (program / "train.py").write_text(PROGRAM.lstrip("\n"), encoding="utf-8")
    env = clean_env(PYTHONPATH=str(site), DMLPATCH_PATCHES=str(specs))
    reports = []
    for command in (["--device", "sim"], ["check", "--html", str(tmp_path / "page")]):
        report = tmp_path / "report.json"
        result = run_python(
            ["-m", "dmlpatch", *command, f"--report={report}", "train.py"], cwd=program, env=env
        )
        assert result.out == "True True cpu\n", result.err
        reports.append(json.loads(report.read_text(encoding="utf-8")))
    (program / "test_suite.py").write_text(SUITE.lstrip("\n"), encoding="utf-8")
    report = tmp_path / "suite.json"
    result = run_python(
        [
            "-m",
            "dmlpatch",
            "--device",
            "sim",
            f"--report={report}",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_suite.py",
        ],
        cwd=program,
        env=clean_env(),
    )
    assert result.code == 0, result.out + result.err
    reports.append(json.loads(report.read_text(encoding="utf-8")))
    return reports


def test_the_report_page_lists_every_field_a_run_writes_and_no_other(
    tmp_path: Path, fake_distribution: Callable[..., Path]
) -> None:
    fields = documented()
    assert len(fields) == len(set(fields)), "a field the page lists twice"
    listed = {field[:depth] for field in fields for depth in range(1, len(field) + 1)}
    ordinary, checked, suite = _reports(tmp_path, fake_distribution)
    assert ordinary["compute"]["counted"] == "layers", ordinary["compute"]
    assert checked["compute"]["counted"] == "operators", checked["compute"]
    assert len(suite["compute"]["tests"]["warned"]) == 1, suite["compute"]
    seen = written(ordinary) | written(checked) | written(suite)
    missing = sorted(_shown(field) for field in seen if not any(_matches(field, p) for p in listed))
    never = sorted(_shown(p) for p in fields if not any(_matches(field, p) for field in seen))
    assert (missing, never) == ([], []), f"written, not on {PAGE.name}; on it, never written"
