"""The bytecode cache of rewritten modules: warm, cold, stale, damaged, unwritable, concurrent."""

from __future__ import annotations

import _imp
import importlib.util
import json
import marshal
import os
import py_compile
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corpus._harness import Sandbox, child_env, sandbox
from dmlpatch._version import __version__
from dmlpatch.rewriting import bytecode_cache, hook
from dmlpatch.rewriting import transform as rewrite

#: A source hash where the test does not validate by hash.
NO_HASH = bytes(8)

SOURCE = """
    def move(x):
        return x.to('cuda')

    def count():
        return torch.cuda.device_count()

    ANSWER = {answer}
    """


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    # Writing is the default, but the environment running the tests may say otherwise
    # (PYTHONDONTWRITEBYTECODE=1); the test that needs it off turns it off itself.
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    with sandbox(tmp_path / "tree") as created:
        yield created


def make(box: Sandbox, answer: int = 1) -> Path:
    path = box.write("mod", SOURCE.format(answer=answer))
    box.install("mod", expect_sites=2)
    return path


def cache_file(path: Path, expect_sites: int = 2) -> Path:
    location = bytecode_cache.location(
        str(path), bytecode_cache.tag("f1", expect_sites, "dmlpatch.runtime.sites")
    )
    assert location is not None
    return Path(location)


def reload(box: Sandbox) -> object:
    box.forget()
    return box.load("mod")


def no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("a warm import parsed the source")

    monkeypatch.setattr(rewrite, "rewrite", refuse)


def test_the_tag_is_alphanumeric_and_carries_version_spec_and_runtime() -> None:
    tag = bytecode_cache.tag("abc", 2, "dmlpatch.runtime.sites")
    assert tag.isalnum()
    assert tag.startswith("dmlpatch" + "".join(c for c in __version__ if c.isalnum()))
    others = {
        bytecode_cache.tag("abd", 2, "dmlpatch.runtime.sites"),
        bytecode_cache.tag("abc", 3, "dmlpatch.runtime.sites"),
        # Rewritten code imports its runtime by name: a moved runtime needs a new cache.
        bytecode_cache.tag("abc", 2, "dmlpatch.runtime"),
    }
    assert len({tag, *others}) == 4
    name = Path(importlib.util.cache_from_source("/x/foo.py", optimization=tag)).name
    assert name == f"foo.{sys.implementation.cache_tag}.opt-{tag}.pyc"


def test_cold_import_writes_the_tagged_pyc(box: Sandbox) -> None:
    path = make(box)
    assert box.load("mod").ANSWER == 1
    cached = cache_file(path)
    assert cached.parent == path.parent / "__pycache__"
    code, sites = bytecode_cache.read(str(cached), str(path), bytecode_cache.stamp(str(path)))
    assert code.co_filename == str(path)
    assert [site.kind for site in sites] == ["device_literal", "cuda_api"]
    assert box.rewrites() == [{"module": box.name("mod"), "sites": 2, "cached": False}]
    assert [p.name for p in cached.parent.iterdir() if p.suffix == ".tmp"] == []


def test_warm_import_reads_the_cache_without_parsing(
    box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(box)
    box.load("mod")
    no_parse(monkeypatch)
    module = reload(box)
    assert "__dmlpatch__" in vars(module)
    assert [entry["cached"] for entry in box.rewrites()] == [False, True]
    assert [entry["sites"] for entry in box.rewrites()] == [2, 2]


def test_a_changed_source_is_rewritten_again(box: Sandbox) -> None:
    path = make(box, answer=1)
    box.load("mod")
    before = cache_file(path).read_bytes()
    box.write("mod", SOURCE.format(answer=22))
    assert reload(box).ANSWER == 22
    assert [entry["cached"] for entry in box.rewrites()] == [False, False]
    assert cache_file(path).read_bytes() != before


def test_a_touched_source_of_the_same_size_is_rewritten_again(box: Sandbox) -> None:
    path = make(box, answer=1)
    box.load("mod")
    box.write("mod", SOURCE.format(answer=2))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert reload(box).ANSWER == 2
    assert [entry["cached"] for entry in box.rewrites()] == [False, False]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"", id="empty"),
        pytest.param(lambda data: b"garbage" * 10, id="garbage"),
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:30], id="truncated-payload"),
        pytest.param(lambda data: data[:32] + b"\xff" * 40, id="bad-marshal"),
        pytest.param(lambda data: b"\0\0\0\0" + data[4:], id="other-python"),
        pytest.param(lambda data: data[:8] + bytes(16) + data[24:], id="other-source"),
        pytest.param(lambda data: data[:4] + b"dml1" + data[8:], id="older-format"),
    ],
)
def test_a_damaged_cache_file_is_rebuilt(box: Sandbox, damage) -> None:
    path = make(box)
    box.load("mod")
    cached = cache_file(path)
    cached.write_bytes(damage(cached.read_bytes()))
    assert "__dmlpatch__" in vars(reload(box))
    assert [entry["cached"] for entry in box.rewrites()] == [False, False]
    assert bytecode_cache.read(str(cached), str(path), bytecode_cache.stamp(str(path)))


def test_foreign_payloads_are_misses(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("x = 1\n", encoding="utf-8")
    stamp = bytecode_cache.stamp(str(source))
    cached = tmp_path / "m.pyc"
    code = compile("x = 1\n", str(source), "exec")
    header = importlib.util.MAGIC_NUMBER + b"dml2" + bytes(24)
    for payload in [
        (1, 2),
        ((("a",),), code),
        ((), "not code"),
        [((), code)],
        (((1, 2, 3),), code),
        ((("1", 2, "kind", "text"),), code),
    ]:
        assert bytecode_cache.write(str(cached), stamp, NO_HASH, code, [])
        data = cached.read_bytes()
        cached.write_bytes(data[:32] + marshal.dumps(payload))
        assert bytecode_cache.read(str(cached), str(source), stamp) is None, payload
    cached.write_bytes(header)
    assert bytecode_cache.read(str(cached), str(source), stamp) is None


def test_a_moved_tree_is_rewritten_for_its_new_place(box: Sandbox, tmp_path: Path) -> None:
    path = make(box)
    box.load("mod")
    moved = tmp_path / "moved"
    moved.mkdir()
    os.rename(box.directory, moved / box.package)
    box.root = moved
    sys.path.insert(0, str(moved))
    module = reload(box)
    assert module.move.__code__.co_filename == str(moved / box.package / path.name)
    assert [entry["cached"] for entry in box.rewrites()] == [False, False]


def test_an_unwritable_cache_location_falls_back_to_no_caching(
    box: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # chmod cannot stop root, so make the cache directory impossible: under a regular file.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setattr(sys, "pycache_prefix", str(blocker / "cache"))
    path = make(box)
    cached = cache_file(path)
    assert str(cached).startswith(str(blocker))
    assert not bytecode_cache.write(
        str(cached), bytecode_cache.stamp(str(path)), NO_HASH, compile("", "", "exec"), []
    )
    assert "__dmlpatch__" in vars(box.load("mod"))
    assert "__dmlpatch__" in vars(reload(box))
    assert [entry["cached"] for entry in box.rewrites()] == [False, False]
    assert not (path.parent / "__pycache__").exists() or not any(
        "dmlpatch" in p.name for p in (path.parent / "__pycache__").iterdir()
    )


def test_pycache_prefix_is_honoured(
    box: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "prefix"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    path = make(box)
    box.load("mod")
    cached = cache_file(path)
    assert cached.is_file()
    assert prefix in cached.parents


def test_dont_write_bytecode_writes_nothing_but_still_reads(
    box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make(box)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    box.load("mod")
    assert not cache_file(path).exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    reload(box)
    assert cache_file(path).exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    reload(box)
    assert [entry["cached"] for entry in box.rewrites()] == [False, False, True]


def test_a_stale_verdict_is_cached_too(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    path = box.write("mod", SOURCE.format(answer=1))
    box.install("mod", expect_sites=5)
    assert "__dmlpatch__" not in vars(box.load("mod"))
    assert cache_file(path, expect_sites=5).exists()
    no_parse(monkeypatch)
    assert "__dmlpatch__" not in vars(reload(box))
    assert len(box.skips()) == 2
    assert box.rewrites() == []


_CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from dmlpatch.rewriting import hook
from dmlpatch import report
open(os.path.join(sys.argv[2], str(os.getpid())), "w").close()
while not os.path.exists(os.path.join(sys.argv[2], "go")):
    time.sleep(0.005)
hook.install([hook.ModuleTarget(sys.argv[3], "spec", 2, "f1")])
module = __import__(sys.argv[3], fromlist=["*"])
assert "__dmlpatch__" in vars(module)
print(json.dumps(report.snapshot()["patches"]["spec"]["modules"]))
"""


#: How many processes race for one cold cache: 16 processes importing the same targets at once
#: (a DataLoader's spawn workers, DDP ranks).
RACERS = 16


def race(command: list[str], ready: Path, env: dict[str, str]) -> list[tuple[int, str, str]]:
    """Start ``RACERS`` copies of ``command``; once all are waiting, let them go at once.

    Each child touches a file in ``ready`` when it is set up, then waits for ``ready/go``.
    Returns ``(returncode, stdout, stderr)`` per child.
    """
    children = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(RACERS)
    ]
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < len(children) and time.monotonic() < deadline:
        time.sleep(0.01)
    (ready / "go").touch()
    outcomes = [child.communicate(timeout=120) for child in children]
    return [
        (child.returncode, out.decode(), err.decode())
        for child, (out, err) in zip(children, outcomes)
    ]


def test_concurrent_cold_imports_all_succeed(box: Sandbox, tmp_path: Path) -> None:
    path = make(box)
    ready = tmp_path / "ready"
    ready.mkdir()
    command = [sys.executable, "-c", _CHILD, str(box.root), str(ready), box.name("mod")]
    outcomes = race(command, ready, child_env())
    for returncode, out, err in outcomes:
        assert returncode == 0, err
        [entry] = json.loads(out)
        assert entry["sites"] == 2
    cached = cache_file(path)
    assert bytecode_cache.read(str(cached), str(path), bytecode_cache.stamp(str(path)))
    assert [p.name for p in cached.parent.iterdir() if p.suffix == ".tmp"] == []
    (ready / "go").touch()
    warm = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=60)
    assert warm.returncode == 0, warm.stderr
    assert json.loads(warm.stdout) == [{"module": box.name("mod"), "sites": 2, "cached": True}]


_REAL_CHILD = """
import json, os, sys, time
from importlib.machinery import PathFinder
from dmlpatch.specs import engine
from dmlpatch.rewriting import hook
from dmlpatch import report

def search_path(package):
    # The package's directories, found without importing it: its __init__ imports torch.
    path = None
    parts = package.split(".") if package else []
    for end in range(1, len(parts) + 1):
        path = PathFinder.find_spec(".".join(parts[:end]), path).submodule_search_locations
    return path

ready = sys.argv[1]
open(os.path.join(ready, str(os.getpid())), "w").close()
while not os.path.exists(os.path.join(ready, "go")):
    time.sleep(0.005)
engine.install("cpu")
finder = sys.meta_path[0]
origins = {}
for name in sorted(hook.targets()):
    spec = finder.find_spec(name, search_path(name.rpartition(".")[0]))
    code = spec.loader.get_code(name)  # what importing would run: cached, or rewritten now
    assert "__dmlpatch__" in code.co_names, name
    origins[name] = spec.origin
print(json.dumps({"origins": origins, "patches": report.snapshot()["patches"]}))
"""


def test_concurrent_cold_loads_of_the_real_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 processes activate dmlpatch and load every target of the real specs at once.

    Cold without touching site-packages: ``PYTHONPYCACHEPREFIX`` sends every bytecode cache
    (CPython's and ours) to an empty private tree, and ``DMLPATCH_CACHE_DIR`` the plan cache.
    Each child goes through the hook's finder and loader as an import does, but stops short of
    executing the modules: that would import torch in 16 processes at once (about 4 CPU
    seconds and 850 MB each).
    """
    prefix, ready = tmp_path / "pycache", tmp_path / "ready"
    ready.mkdir()
    env = child_env(PYTHONPYCACHEPREFIX=str(prefix), DMLPATCH_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-c", _REAL_CHILD, str(ready)]
    reports = []
    for returncode, out, err in race(command, ready, env):
        assert returncode == 0, err
        reports.append(json.loads(out))
    origins = reports[0]["origins"]
    assert len(origins) >= 20  # facexlib, basicsr, gfpgan and realesrgan are installed
    sites = {
        name: len(rewrite.find_sites(Path(origin).read_bytes())) for name, origin in origins.items()
    }
    for report in reports:
        assert report["origins"] == origins
        loaded = {
            entry["module"]: entry["sites"]
            for spec in report["patches"].values()
            for entry in spec["modules"]
        }
        assert loaded == sites
        assert not any(spec["skipped"] for spec in report["patches"].values())

    targets = {target.module: target for target in _real_targets()}
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    for name, origin in origins.items():
        source = Path(origin)
        target = targets[name]
        tag = bytecode_cache.tag(target.fingerprint, target.expect_sites, target.runtime)
        cached = Path(bytecode_cache.location(origin, tag) or "")
        assert prefix in cached.parents
        hit = bytecode_cache.read(str(cached), origin, bytecode_cache.stamp(origin))
        assert hit is not None, f"{cached} is torn or missing"
        code, cached_sites = hit
        expected = rewrite.rewrite(source.read_bytes(), origin)
        assert code == compile(expected.tree, origin, "exec", dont_inherit=True), name
        assert cached_sites == expected.sites
    assert [path for path in prefix.rglob("*") if ".tmp" in path.name] == []

    (ready / "go").touch()
    warm = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert warm.returncode == 0, warm.stderr
    cached_flags = {
        entry["cached"]
        for spec in json.loads(warm.stdout)["patches"].values()
        for entry in spec["modules"]
    }
    assert cached_flags == {True}


def _real_targets() -> list[hook.ModuleTarget]:
    from dmlpatch.specs import plan

    return [hook.ModuleTarget(*target) for target in plan.build()["targets"]]


def test_write_is_atomic_for_readers(tmp_path: Path) -> None:
    """A reader never sees a partial file: it sees the old one or the new one."""
    source = tmp_path / "m.py"
    source.write_text(textwrap.dedent("x = 1\n"), encoding="utf-8")
    stamp = bytecode_cache.stamp(str(source))
    cached = tmp_path / "__pycache__" / "m.pyc"
    big = compile("x = [" + ", ".join(str(i) for i in range(20000)) + "]\n", str(source), "exec")
    small = compile("x = 1\n", str(source), "exec")
    assert bytecode_cache.write(str(cached), stamp, NO_HASH, small, [])
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom dmlpatch.rewriting import bytecode_cache as c\n"
            "s = (int(sys.argv[3]), int(sys.argv[4]))\n"
            "for _ in range(3000):\n"
            "    assert c.read(sys.argv[1], sys.argv[2], s) is not None\n",
            str(cached),
            str(source),
            *map(str, stamp),
        ],
        env=child_env(),
        stderr=subprocess.PIPE,
    )
    while reader.poll() is None:
        for code in (big, small):
            assert bytecode_cache.write(str(cached), stamp, NO_HASH, code, [])
    assert reader.returncode == 0, reader.stderr.read().decode() if reader.stderr else ""


def _same_size_edit_keeping_mtime(path: Path, text: str) -> None:
    before = path.stat()
    path.write_text(text, encoding="utf-8")
    assert path.stat().st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize(
    ("mode", "check", "noticed"),
    [
        # python checks a checked-hash pyc's source hash: an edit keeping size and time shows
        (py_compile.PycInvalidationMode.CHECKED_HASH, "default", True),
        # --check-hash-based-pycs always: every hash-based pyc is checked
        (py_compile.PycInvalidationMode.UNCHECKED_HASH, "always", True),
        # unchecked, or timestamp-based: python trusts the stamp, and so does the cache
        (py_compile.PycInvalidationMode.UNCHECKED_HASH, "default", False),
        (py_compile.PycInvalidationMode.TIMESTAMP, "always", False),
        (py_compile.PycInvalidationMode.CHECKED_HASH, "never", False),
    ],
    ids=["checked-hash", "unchecked-always", "unchecked", "timestamp", "never"],
)
def test_the_cache_is_invalidated_as_python_invalidates_the_source_pyc(
    box: Sandbox,
    monkeypatch: pytest.MonkeyPatch,
    mode: py_compile.PycInvalidationMode,
    check: str,
    noticed: bool,
) -> None:
    """An edit that keeps the source's size and mtime: the rewritten module is what python
    would run, given the mode of the module's own pyc and --check-hash-based-pycs."""
    monkeypatch.setattr(_imp, "check_hash_based_pycs", check)
    path = make(box, answer=1)
    py_compile.compile(
        str(path), cfile=importlib.util.cache_from_source(str(path)), invalidation_mode=mode
    )
    assert box.load("mod").ANSWER == 1
    _same_size_edit_keeping_mtime(path, textwrap.dedent(SOURCE.format(answer=2)).lstrip("\n"))
    answer = reload(box).ANSWER
    assert answer == (2 if noticed else 1)
    assert [entry["cached"] for entry in box.rewrites()] == [False, not noticed]


def test_a_cache_file_another_user_could_write_is_a_miss(box: Sandbox) -> None:
    path = make(box)
    box.load("mod")
    cached = cache_file(path)
    assert cached.stat().st_mode & 0o777 == 0o644  # readable as the source is, ours to write
    cached.chmod(0o666)
    assert bytecode_cache.read(str(cached), str(path), bytecode_cache.stamp(str(path))) is None
    assert "__dmlpatch__" in vars(reload(box))
    assert [entry["cached"] for entry in box.rewrites()] == [False, False]
    assert cached.stat().st_mode & 0o777 == 0o644  # written anew
