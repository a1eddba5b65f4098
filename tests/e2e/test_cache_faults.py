"""Fault injection over every cache dmlpatch keeps: each one repairs itself.

A cache is a file dmlpatch wrote earlier and trusts later: the patch plan, discovery's verdicts,
the bytecode of rewritten modules, the simulated device's operator index, its library and that
library's record. Each is warmed by a first run, then hit by one fault:

- ``corrupt``: bytes in the middle changed; ``truncate``: cut in half; ``delete``: removed;
- ``plant``: replaced by a well-formed file of another user's (uid 1002, as root can make it)
  whose content would show if it ran, or a file of ours that the group could write;
- ``race``: many processes fill the cold cache at once.

The next run must behave as the first (same output, no traceback, no extra line; the
first-run line is a matter of timing and is left out of the comparison) and leave the
cache valid again, owned by this user and private. The library's faults are checked against the
real build functions with the compiler step replaced by a copy of a built library (each real
build takes tens of seconds); one real rebuild, of a truncated library by two processes at once,
shows the end to end repair.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from dmlpatch.rewriting import bytecode_cache, discovery
from dmlpatch.sim import build
from dmlpatch.specs import plan

from support import Result, clean_env, run_python

OTHER_UID = 1002
PROGRAM = """
import json
import mylib
print("ok", "__dmlpatch__" in vars(mylib), json.dumps(1))
"""
MYLIB = """
def pick():
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""
EXPECTED = "ok True 1\n"
PLANTED = "PLANTED CODE RAN"


@dataclass
class Workspace:
    root: Path
    inputs: Path
    cache: Path

    def run(self, *argv: str) -> Result:
        env = clean_env(DMLPATCH_CACHE_DIR=str(self.cache))
        del env["PYTHONDONTWRITEBYTECODE"]  # the bytecode cache is written as users' pythons do
        completed = subprocess.run(
            [sys.executable, "-m", "dmlpatch", *argv],
            cwd=self.inputs,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return Result(completed.returncode, completed.stdout, completed.stderr)

    def program(self) -> Result:
        return self.run("--device", "cpu", str(self.inputs / "program.py"))


@pytest.fixture
def ws() -> Iterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="cache-faults-"))
    root.chmod(0o755)
    made = Workspace(root, root / "inputs", root / "cache")
    made.inputs.mkdir()
    made.cache.mkdir(mode=0o700)
    (made.inputs / "program.py").write_text(PROGRAM)
    (made.inputs / "mylib.py").write_text(textwrap.dedent(MYLIB).lstrip())
    # What a planted plan would wrap json.dumps with: importing it shows.
    (made.inputs / "planted_fix.py").write_text(f"print({PLANTED!r})\ndef fix(*a):\n    pass\n")
    try:
        yield made
    finally:
        shutil.rmtree(root)


def _plan_files(ws: Workspace) -> list[Path]:
    return sorted((ws.cache / "plans").glob("*.plan"))


def _index_files(ws: Workspace) -> list[Path]:
    return sorted((ws.cache / "discovery").glob("mylib-*.idx"))


def _bytecode_files(ws: Workspace) -> list[Path]:
    return sorted((ws.inputs / "__pycache__").glob("mylib.*opt-dmlpatch*.pyc"))


def _plan_valid(ws: Workspace, path: Path) -> None:
    assert plan._well_formed(marshal.loads(path.read_bytes()))


def _index_valid(ws: Workspace, path: Path) -> None:
    entry = discovery._read(str(path))[str(ws.inputs / "mylib.py")]
    assert entry[3] == 2  # mylib's two sites: the literal and the availability choice


def _bytecode_valid(ws: Workspace, path: Path) -> None:
    source = str(ws.inputs / "mylib.py")
    hit = bytecode_cache.read(str(path), source, bytecode_cache.stamp(source))
    assert hit is not None and "__dmlpatch__" in hit[0].co_names


def _planted_plan(ws: Workspace, path: Path) -> bytes:
    cached = marshal.loads(path.read_bytes())
    cached["wraps"] = [*cached["wraps"], ("planted", "json:dumps", "planted_fix:fix", "why")]
    return marshal.dumps(cached)


def _planted_index(ws: Workspace, path: Path) -> bytes:
    """Verdicts that say mylib has no site: if read, mylib would run unrewritten."""
    entries = discovery._read(str(path))
    origin = str(ws.inputs / "mylib.py")
    entries[origin] = (*entries[origin][:3], 0, ())
    return marshal.dumps((discovery._FORMAT, entries))


def _planted_bytecode(ws: Workspace, path: Path) -> bytes:
    """A well-formed entry for the current source whose code prints."""
    data = path.read_bytes()
    code = compile(f"print({PLANTED!r})\n", str(ws.inputs / "mylib.py"), "exec")
    return data[:32] + marshal.dumps(((), code))


@dataclass(frozen=True)
class Cache:
    files: Callable[[Workspace], list[Path]]
    valid: Callable[[Workspace, Path], None]
    planted: Callable[[Workspace, Path], bytes]
    mode: int  # of a file dmlpatch writes


CACHES = {
    "plan": Cache(_plan_files, _plan_valid, _planted_plan, 0o600),
    "discovery": Cache(_index_files, _index_valid, _planted_index, 0o600),
    # readable as its source is (0644 here), writable by its owner only
    "bytecode": Cache(_bytecode_files, _bytecode_valid, _planted_bytecode, 0o644),
}


def _corrupt(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 16]) + data[middle + 16 :]


def _inflict(fault: str, cache: Cache, ws: Workspace, path: Path) -> None:
    if fault == "corrupt":
        path.write_bytes(_corrupt(path.read_bytes()))
    elif fault == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif fault == "delete":
        path.unlink()
    elif fault == "plant":
        assert os.geteuid() == 0, "another user's file needs root (the suite runs as root)"
        planted = cache.planted(ws, path)
        path.unlink()
        path.write_bytes(planted)
        os.chown(path, OTHER_UID, OTHER_UID)
    elif fault == "plant-group-writable":
        planted = cache.planted(ws, path)
        path.write_bytes(planted)
        path.chmod(0o664)


@pytest.mark.parametrize(
    "fault", ["corrupt", "truncate", "delete", "plant", "plant-group-writable"]
)
@pytest.mark.parametrize("name", sorted(CACHES))
def test_a_damaged_cache_is_a_miss_and_is_written_again(
    name: str, fault: str, ws: Workspace
) -> None:
    cache = CACHES[name]
    first = ws.program()
    assert (first.code, first.out) == (0, EXPECTED), first.err
    (path,) = cache.files(ws)
    cache.valid(ws, path)
    _inflict(fault, cache, ws, path)
    again = ws.program()
    assert (again.code, again.out, again.err_lines) == (first.code, first.out, first.err_lines)
    assert PLANTED not in again.out + again.err
    (repaired,) = cache.files(ws)
    cache.valid(ws, repaired)
    status = repaired.stat()
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (os.geteuid(), cache.mode)


def test_cold_caches_filled_by_many_processes_at_once(ws: Workspace) -> None:
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: ws.program(), range(6)))
    for result in results:
        assert (result.code, result.out) == (0, EXPECTED), result.err
        assert result.err_lines == ["dmlpatch: running on cpu: requested with --device cpu"]
    for cache in CACHES.values():
        (path,) = cache.files(ws)
        cache.valid(ws, path)
    leftovers = [p for p in [*ws.cache.rglob("*"), *ws.inputs.rglob("*")] if ".tmp" in p.name]
    assert leftovers == []


# -- the simulated device: its operator index, its library and the library's record ----------

TORCH_PROGRAM = "import torch\nx = torch.ones(3).cuda() * 2\nprint(x.device, x.sum().item())\n"


@pytest.fixture(scope="module")
def built() -> Path:
    """A verified build of the simulator (the shared cache's; built there on first use)."""
    made = run_python(
        ["-c", "from dmlpatch.sim import build; print(build.ensure_built())"], timeout=900
    )
    assert made.code == 0, made.err[-2000:]
    directory = Path(made.out.strip()).parent
    assert build.verified(directory)
    return directory


def _private_copy(built: Path, ws: Workspace) -> Path:
    """The built directory copied into this test's cache, so faults stay here."""
    target = ws.cache / "sim" / built.name
    target.parent.mkdir(mode=0o700)
    shutil.copytree(built, target, ignore=shutil.ignore_patterns("*.lock", "lock"))
    return target


@pytest.mark.parametrize("fault", ["corrupt", "truncate", "delete", "plant"])
def test_a_damaged_operator_index_is_parsed_again(fault: str, ws: Workspace, built: Path) -> None:
    directory = _private_copy(built, ws)
    (ws.inputs / "on_device.py").write_text(TORCH_PROGRAM)
    first = ws.run("--device", "sim", str(ws.inputs / "on_device.py"))
    assert first.out == "privateuseone:0 6.0\n", first.err
    index = directory / "opindex.json"
    expected = json.loads(index.read_bytes())
    if fault == "plant":
        os.chown(index, OTHER_UID, OTHER_UID)  # its content stays right: its owner is wrong
    else:
        _inflict(fault, CACHES["plan"], ws, index)
    again = ws.run("--device", "sim", str(ws.inputs / "on_device.py"))
    assert (again.code, again.out, again.err_lines) == (first.code, first.out, first.err_lines)
    assert json.loads(index.read_bytes()) == expected
    status = index.stat()
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (os.geteuid(), 0o600)


LIBRARY_FAULTS = {
    "truncate": lambda lib, record: lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2]),
    "corrupt": lambda lib, record: lib.write_bytes(_corrupt(lib.read_bytes())),
    "delete": lambda lib, record: lib.unlink(),
    "delete-record": lambda lib, record: record.unlink(),
    "plant": lambda lib, record: os.chown(lib, OTHER_UID, OTHER_UID),
    "plant-record": lambda lib, record: record.chmod(0o666),
    "group-writable": lambda lib, record: lib.chmod(0o770),
}


@pytest.mark.parametrize("fault", sorted(LIBRARY_FAULTS))
def test_a_damaged_library_is_built_again(
    fault: str, ws: Workspace, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ensure_built loads is the library it recorded, or a new build: never a damaged or
    foreign one (a truncated library killed the process with SIGBUS; a deleted one was never
    built again). The compiler is replaced by a copy of the built library."""
    directory = _private_copy(built, ws)
    monkeypatch.setenv("DMLPATCH_CACHE_DIR", str(ws.cache))
    compiled: list[Path] = []

    def compile_by_copying(target: Path) -> None:
        assert sorted(p.name for p in target.iterdir()) in ([], [".dmlpatch.lock"])
        shutil.copy(build.library_path(built), build.library_path(target))
        compiled.append(target)

    monkeypatch.setattr(build, "_compile", compile_by_copying)
    library, record = build.library_path(directory), directory / "complete"
    assert build.ensure_built() == library and compiled == []  # the copy verifies as it is
    LIBRARY_FAULTS[fault](library, record)
    assert not build.verified(directory)
    assert build.ensure_built() == library
    assert compiled == [directory]
    assert build.verified(directory)
    digest = hashlib.sha256(build.library_path(built).read_bytes()).hexdigest()
    assert hashlib.sha256(library.read_bytes()).hexdigest() == digest
    for entry in directory.iterdir():
        status = entry.stat()
        assert status.st_uid == os.geteuid()
        assert stat.S_IMODE(status.st_mode) & 0o077 == 0, entry


def test_a_build_is_private_whatever_the_umask(
    ws: Workspace, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under umask 002 the compiler leaves group-writable files: the build directory is made
    0700 and everything in it private before the record is written."""
    monkeypatch.setenv("DMLPATCH_CACHE_DIR", str(ws.cache))

    def compile_group_writable(target: Path) -> None:
        shutil.copy(build.library_path(built), build.library_path(target))
        (target / "unity.o").write_bytes(b"object")
        for entry in target.iterdir():
            entry.chmod(0o664)

    monkeypatch.setattr(build, "_compile", compile_group_writable)
    previous = os.umask(0o002)
    try:
        library = build.ensure_built()
    finally:
        os.umask(previous)
    directory = library.parent
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [directory, *directory.iterdir()]}
    assert modes.pop(directory.name) == 0o700
    assert modes.pop(library.name) == 0o700
    assert set(modes.values()) == {0o600}, modes
    assert stat.S_IMODE((ws.cache / "sim").stat().st_mode) == 0o700
    assert build.verified(directory)


def test_a_truncated_library_is_rebuilt_by_two_processes_at_once(
    ws: Workspace, built: Path
) -> None:
    """End to end, with the compiler: the library cut in half (the dynamic loader would die
    of SIGBUS on it), two programs start on the device at once; one builds, the other waits
    for the build lock, and both run."""
    directory = _private_copy(built, ws)
    library = build.library_path(directory)
    library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])
    (ws.inputs / "on_device.py").write_text(TORCH_PROGRAM)
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda _: ws.run("--device", "sim", str(ws.inputs / "on_device.py")), [1, 2])
        )
    for result in results:
        assert (result.code, result.out) == (0, "privateuseone:0 6.0\n"), result.err[-2000:]
    assert build.verified(directory)
