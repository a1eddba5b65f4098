"""Discovery's cached verdicts live only as long as the rewriter's rules that made them."""

from __future__ import annotations

import marshal
from pathlib import Path

import pytest

from dmlpatch.rewriting import discovery, hook
from dmlpatch.rewriting.discovery import Verdict


def test_a_verdict_is_read_back_for_the_same_source(tmp_path: Path) -> None:
    index = discovery._Index(str(tmp_path / "pkg.idx"))
    index.put("/src/mod.py", (10, 20), bytes(8), Verdict(2, ()))
    index.flush()
    again = discovery._Index(str(tmp_path / "pkg.idx"))
    assert again.get("/src/mod.py", (10, 20)) == Verdict(2, ())
    assert again.get("/src/mod.py", (11, 20)) is None


def test_verdicts_of_earlier_rules_are_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scipy's xp_device_type was counted as 2 sites by generation 4; a process of generation 5
    must examine it again instead of loading it through the rewriting loader."""
    path = tmp_path / "scipy.idx"
    index = discovery._Index(str(path))
    index.put("/src/_array_api.py", (10, 20), bytes(8), Verdict(2, ()))
    index.flush()
    assert marshal.loads(path.read_bytes())[0] == (2, hook.GENERATION)
    monkeypatch.setattr(discovery, "_FORMAT", (2, hook.GENERATION + 1))
    assert discovery._Index(str(path)).get("/src/_array_api.py", (10, 20)) is None
