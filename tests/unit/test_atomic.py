"""The one atomic-write helper behind the activation line, the pin, the plan and both caches."""

from __future__ import annotations

import _thread
import os
import stat
from pathlib import Path

import pytest

from dmlpatch import atomic


def test_replaces_whole_and_leaves_nothing_beside(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "file.bin"
    atomic.write(target, b"old")
    atomic.write(target, b"new", durable=True)
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.bin"]


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
def test_mode_is_set(tmp_path: Path) -> None:
    target = tmp_path / "line.pth"
    atomic.write(target, b"x", mode=0o640)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_dead_writers_temporary_file_is_taken_over(tmp_path: Path) -> None:
    target = tmp_path / "plan"
    stale = Path(f"{target}.{os.getpid()}.{_thread.get_ident()}.tmp")
    stale.write_bytes(b"half")
    atomic.write(target, b"whole")
    assert target.read_bytes() == b"whole" and not stale.exists()


def test_a_failed_replace_keeps_the_old_file_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "is-a-directory"
    (target / "inside").mkdir(parents=True)  # os.replace of a file onto a directory fails
    with pytest.raises(OSError):
        atomic.write(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["is-a-directory"]
    assert (target / "inside").is_dir()
