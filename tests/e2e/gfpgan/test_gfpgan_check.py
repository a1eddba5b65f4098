"""``dmlpatch check`` on the GFPGAN demo: the seed's program, judged before deployment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import run_python


@pytest.mark.parametrize(
    ("profile", "fixed"),
    [("torch-directml-0.2.5", set()), ("pytorch-directml-1.8", {"aten::normal_"})],
)
def test_check_on_the_demo(assets, tmp_path: Path, profile: str, fixed: set[str]) -> None:
    work = assets.workdir(tmp_path)
    report = tmp_path / "check.json"
    args = [
        "-m", "dmlpatch", "check", "--device", "sim", "--profile", profile, f"--json={report}",
        str(assets.script), "-i", str(assets.root / "inputs" / "aligned"), "-o", "results",
        "-v", "1.3", "--aligned", "--bg_upsampler", "none",
    ]  # fmt: skip
    result = run_python(args, env=assets.env(), cwd=work, timeout=600)
    assert result.code == 0, result.err[-3000:]
    data = json.loads(report.read_text())
    assert data["status"] == "runs"
    assert {row["op"] for row in data["ops"] if row["how"] == "refused"} == set()
    assert {row["op"] for row in data["ops"] if row["how"] == "fixed"} == fixed
    assert data["verdict"].startswith("runs on DirectML with 0 fallbacks")
    assert any((work / "results" / "restored_faces").iterdir())
