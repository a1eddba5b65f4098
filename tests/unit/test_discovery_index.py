"""Discovery's cached verdicts live only as long as the rewriter's rules that made them, and
the source python would run: damaged, foreign or untrusted entries are misses."""

from __future__ import annotations

import importlib.util
import marshal
import os
import py_compile
from pathlib import Path

import pytest

from dmlpatch.rewriting import discovery, freshness, rules
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
    assert marshal.loads(path.read_bytes())[0] == (2, rules.GENERATION)
    monkeypatch.setattr(discovery, "_FORMAT", (2, rules.GENERATION + 1))
    assert discovery._Index(str(path)).get("/src/_array_api.py", (10, 20)) is None


@pytest.mark.parametrize("checked", [True, False], ids=["checked-hash-pyc", "timestamp-pyc"])
def test_a_verdict_follows_pythons_invalidation_of_the_source(
    tmp_path: Path, checked: bool
) -> None:
    """An edit that keeps size and mtime: the verdict is examined again exactly where python
    would notice the edit (the module's own pyc is checked-hash)."""
    source = tmp_path / "mod.py"
    source.write_text("DEVICE = 'cpu'\n")
    mode = py_compile.PycInvalidationMode
    py_compile.compile(
        str(source),
        cfile=importlib.util.cache_from_source(str(source)),
        invalidation_mode=mode.CHECKED_HASH if checked else mode.TIMESTAMP,
    )
    status = source.stat()
    stamp = (status.st_mtime_ns, status.st_size)
    written = discovery._Index(str(tmp_path / "pkg.idx"))
    written.put(str(source), stamp, freshness.source_hash(source.read_bytes()), Verdict(0, ()))
    written.flush()
    index = discovery._Index(str(tmp_path / "pkg.idx"))
    assert index.get(str(source), stamp) == Verdict(0, ())
    source.write_text("DEVICE = 'gpu'\n")
    os.utime(source, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert (index.get(str(source), stamp) is None) == checked


@pytest.mark.parametrize(
    "entry",
    [
        3,
        (1, 2),
        (1, 2, b"", 0),
        (1, 2, "not bytes", 0, ()),
        (1, 2, b"", "2", ()),
        (1, 2, b"", 0, [1]),
    ],
)
def test_an_entry_of_another_shape_is_a_miss(tmp_path: Path, entry: object) -> None:
    path = tmp_path / "pkg.idx"
    path.write_bytes(marshal.dumps((discovery._FORMAT, {"/src/mod.py": entry, 5: entry})))
    path.chmod(0o600)
    assert discovery._Index(str(path)).get("/src/mod.py", (1, 2)) is None


def test_an_index_another_user_could_write_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "pkg.idx"
    index = discovery._Index(str(path))
    index.put("/src/mod.py", (10, 20), bytes(8), Verdict(2, ()))
    index.flush()
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o620)
    assert discovery._Index(str(path)).get("/src/mod.py", (10, 20)) is None
