"""Processes a program starts with ``torch.multiprocessing.spawn`` each say where they run and
write their own report, and a program that reaches the device through ``.to(0)`` (PyTorch's
current accelerator, no CUDA site) is told it runs there.

Before, the ranks said nothing (the runner's process, which never touches the device, held
the line), and ``--report=R-{rank}.json`` gave every rank and the launcher one file: ranks
have no ``$RANK``, so all were ``main``, and the launcher's report overwrote theirs.
"""

from __future__ import annotations

import json
from pathlib import Path

from support import run_python

SPAWNED = """
import torch
import torch.multiprocessing as mp


def work(rank):
    torch.cuda.set_device(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = model.to(0)
    x = torch.randn(4, 8).to(0)
    print(rank, model(x).device, flush=True)


if __name__ == "__main__":
    mp.spawn(work, nprocs=2)
"""

ACCELERATOR_INDEX = """
import torch

model = torch.nn.Linear(8, 2).to(0)
print(model(torch.randn(3, 8).to(0)).device)
"""


def test_each_spawned_rank_says_where_it_runs_and_reports_alone(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(SPAWNED)
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", "--report=R-{rank}.json", "program.py"],
        cwd=tmp_path,
    )
    assert result.code == 0, result.err
    assert sorted(result.out.split("\n")[:2]) == ["0 privateuseone:0", "1 privateuseone:0"]
    said = sorted(line for line in result.err_lines if "running on" in line)
    assert [line.split(" (")[0] for line in said] == [
        "dmlpatch: rank 0: running on privateuseone:0",
        "dmlpatch: rank 1: running on privateuseone:0",
    ]
    for rank in ("0", "1"):
        report = json.loads((tmp_path / f"R-{rank}.json").read_text())
        assert report["device"] == "privateuseone:0"
        assert report["compute"]["on_device"]["calls"] == 2  # its two linear layers
    launcher = json.loads((tmp_path / "R-main.json").read_text())
    assert launcher["compute"] is None  # the launcher computed nothing


def test_a_program_that_reaches_the_device_by_its_index_is_told(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(ACCELERATOR_INDEX)
    result = run_python(["-m", "dmlpatch", "--device", "sim", "program.py"], cwd=tmp_path)
    assert result.code == 0, result.err
    assert result.out.strip() == "privateuseone:0"
    (said,) = [line for line in result.err_lines if "running on" in line]
    assert said.startswith("dmlpatch: running on privateuseone:0 (Simulated Radeon")
