"""``dmlpatch check``'s totals: the fallbacks its headline counts are the ones its table lists,
and the backward pass's work is counted on every torch.

Autograd runs a device's backward on a thread of its own. There, torch 2.4 calls the dispatch
mode that counts with no Python frame above it, and a count that looked for the program's line
used to fail and be dropped: replication padding's backward fell back, the table listed it and
the headline did not, and with ``--html`` every backward convolution and product went missing
(1.5 against 4.6 MFLOP on torch 2.14).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import clean_env, run_python

#: The placement page's example (docs/guide/placement.md): replication padding after a
#: convolution, whose backward DirectML's CPU fallback runs, and a histogram.
PADDED = """
import torch
from torch import nn

model = nn.Sequential(
    nn.Conv2d(3, 8, 3), nn.ReplicationPad2d(1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10)
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(4, 3, 16, 16, device="cuda")
    loss = model(x).square().mean() + torch.histc(x, 10).max()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

#: A fallback in a thread of the program's own, which check's dispatch mode does not reach.
THREADED = """
import threading

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def work():
    x = torch.randn(1, 2, 4, 4, device=device)
    print("histc", torch.histc(x, 5).sum().item())


worker = threading.Thread(target=work)
worker.start()
worker.join()
"""


def _check(directory: Path, program: str, *options: str) -> tuple[Any, dict[str, Any]]:
    (directory / "train.py").write_text(program.lstrip("\n"))
    result = run_python(
        ["-m", "dmlpatch", "check", *options, "--json", "check.json", "train.py"],
        cwd=directory,
        env=clean_env(),
    )
    return result, json.loads((directory / "check.json").read_text())


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    return _check(tmp_path_factory.mktemp("padded"), PADDED, "--html", "page")


def _table(data: dict[str, Any]) -> dict[str, int]:
    return {row["op"]: row["calls"] for row in data["ops"] if row["how"] == "fallback"}


def _headline(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("model compute: "))


def _counted(rows: list[dict[str, Any]]) -> str:
    operators = "operator" if len(rows) == 1 else "operators"
    calls = sum(row["calls"] for row in rows)
    copies = sum(row["copies"] for row in rows)
    return (
        f"{len(rows)} {operators} through DirectML's CPU fallback ({calls} calls, {copies} copies"
    )


def test_the_headline_counts_the_fallbacks_the_table_lists(
    padded: tuple[Any, dict[str, Any]],
) -> None:
    result, data = padded
    assert result.code == 0, result.err
    table = _table(data)
    assert "aten::replication_pad2d_backward" in table, "pick another backward fallback"
    named = data["compute"]["cpu_fallbacks"]
    assert {entry["operator"]: entry["calls"] for entry in named} == table
    rows = [row for row in data["ops"] if row["how"] == "fallback"]
    assert _counted(rows) in _headline(result.err)
    # The backward's fallback is named at the forward line that made it, with its work.
    backward = next(e for e in named if e["operator"] == "aten::replication_pad2d_backward")
    assert backward["at"] == "train.py:10 in <module>"
    assert backward["flops"] > 0


def test_the_backward_pass_counts_on_the_device_on_every_torch(
    padded: tuple[Any, dict[str, Any]],
) -> None:
    result, data = padded
    assert result.code == 0, result.err
    # Per step, from the shapes (families.py's formulas, dmlpatch's own on every torch): the
    # convolution's 6,272 outputs of 27 multiply-adds each, forward and (input and weight)
    # backward, and the linear layer's 4x2048 by 2048x10 product, forward and two backward.
    convolution = 2 * 6272 * 27 + 2 * 2 * 6272 * 27
    linear = 3 * 2 * 4 * 2048 * 10
    assert data["compute"]["on_device"]["flops"] == 3 * (convolution + linear)
    assert "of 4.6 MFLOP" in _headline(result.err)


def test_a_fallback_in_the_program_s_own_thread_is_in_the_headline(tmp_path: Path) -> None:
    result, data = _check(tmp_path, THREADED)
    assert result.code == 0, result.err
    assert result.out == "histc 32.0\n"
    assert _table(data) == {"aten::histc": 1}
    (named,) = data["compute"]["cpu_fallbacks"]
    # Check's dispatch mode never saw it: named with the table's count and first line, no
    # estimate of its work.
    assert named["operator"] == "aten::histc" and named["calls"] == 1
    assert named["at"] == "train.py:10" and named["estimated_by"] is None
    rows = [row for row in data["ops"] if row["how"] == "fallback"]
    assert _counted(rows) in _headline(result.err)
