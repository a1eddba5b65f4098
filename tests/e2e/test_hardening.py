"""dmlpatch as the trusted start-up layer of a process: what the user sees when things are wrong.

The cases of issue #29, in the style of the bad-input table (``test_bad_input.py``): each runs
``python -m dmlpatch`` in a subprocess from an empty working directory and checks the exit code,
dmlpatch's exact lines and what is left on disk. The suite runs as root (CI included), so
"another user" is uid 1002, given files with ``chown``. Beside the table:

- Ctrl-C and SIGTERM end the program as under python under every entry point;
- the main script's globals are python's, name for name;
- what dmlpatch writes is private under umask 022 and 002.

The documentation's Reliability page (docs/reference/reliability.md) lists these promises.
"""

from __future__ import annotations

import marshal
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest

from dmlpatch.paths import file_tag
from dmlpatch.rewriting import discovery, hook, transform
from dmlpatch.specs import plan

from support import Result, clean_env, linked_venv

OTHER_UID = 1002
RUNNING = "dmlpatch: running on cpu: requested with --device cpu"
NOT_YOURS = "set DMLPATCH_CACHE_DIR to a directory of yours that only you can write"


@dataclass
class Box:
    root: Path
    work: Path
    cache: Path
    inputs: Path

    def write(self, relative: str, text: str) -> Path:
        path = self.inputs / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path


@pytest.fixture
def box() -> Iterator[Box]:
    """Outside pytest's private temporary root (another user's files need a reachable path);
    the cache is private, as dmlpatch requires."""
    root = Path(tempfile.mkdtemp(prefix="hardening-"))
    root.chmod(0o755)
    made = Box(root, root / "work", root / "cache", root / "inputs")
    for directory in (made.work, made.cache, made.inputs):
        directory.mkdir()
    made.cache.chmod(0o700)
    made.write("ok.py", "print('ok')\n")
    made.write("torch_ok.py", "import torch\nprint('ok')\n")
    # A module of the program's own with a CUDA device site, so discovery has a verdict on it.
    made.write(
        "mylib.py",
        """
        def pick():
            import torch
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        """,
    )
    made.write("uses_mylib.py", "import mylib\nprint('ok', 'pick' in dir(mylib))\n")
    try:
        yield made
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=True)


def _root_required() -> None:
    assert hasattr(os, "geteuid") and os.geteuid() == 0, "files of another user need root"


def _run(box: Box, argv: list[str], **env: str) -> Result:
    environment = clean_env(DMLPATCH_CACHE_DIR=str(box.cache), HOME=str(box.root / "home"))
    environment.update({k: v.format(box=box) for k, v in env.items()})
    completed = subprocess.run(
        [sys.executable, "-m", "dmlpatch", *(a.format(box=box) for a in argv)],
        env=environment,
        cwd=box.work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Result(completed.returncode, completed.stdout, completed.stderr)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- the cases ------------------------------------------------------------------------------


def _shared_cache(box: Box) -> dict[str, str]:
    shared = box.root / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    return {"DMLPATCH_CACHE_DIR": str(shared)}


def _cache_of_another_user(box: Box) -> dict[str, str]:
    _root_required()
    theirs = box.root / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    return {"DMLPATCH_CACHE_DIR": str(theirs)}


def _planted_simulator(box: Box) -> dict[str, str]:
    """The cache cannot be written (it names a file), so the build would go to the predictable
    ``$TMPDIR/dmlpatch-sim-<uid>``, where another user has put a finished-looking build."""
    _root_required()
    tmp = box.root / "tmp"
    planted = tmp / f"dmlpatch-sim-{os.getuid()}" / "torch-any"
    planted.mkdir(parents=True)
    (planted / "dmlpatch_sim_ext.so").write_bytes(b"\x7fELF not yours")
    (planted / "complete").write_text("torch-any\n")
    for path in (planted.parent, planted, *planted.iterdir()):
        os.chown(path, OTHER_UID, OTHER_UID)
    return {"DMLPATCH_CACHE_DIR": str(box.inputs / "ok.py"), "TMPDIR": str(tmp)}


def _index_file(box: Box) -> Path:
    key = f"{box.inputs}\0mylib"
    return box.cache / "discovery" / f"mylib-{file_tag(key)}.idx"


def _malformed_verdicts(box: Box) -> dict[str, str]:
    """A discovery index whose header is right but whose entries are not verdicts."""
    index = _index_file(box)
    index.parent.mkdir(mode=0o700)
    origin = str(box.inputs / "mylib.py")
    entries = {origin: 3, str(box.inputs / "other.py"): (1, 2), 7: (0, 0, b"", 0, ())}
    index.write_bytes(marshal.dumps((discovery._FORMAT, entries)))
    index.chmod(0o600)
    return {}


def _verdict_repaired(box: Box) -> None:
    written = discovery._read(str(_index_file(box)))
    origin = box.inputs / "mylib.py"
    entry = written[str(origin)]
    assert entry[3] == len(transform.find_sites(origin.read_bytes())) > 0, entry  # examined again


def _malformed_plan(box: Box) -> dict[str, str]:
    """Every plan file in the cache, its header right, a target entry that is a number."""
    first = _run(box, ["--device", "cpu", "{box.inputs}/ok.py"])
    assert first.code == 0, first.err
    for path in (box.cache / "plans").glob("*.plan"):
        cached = marshal.loads(path.read_bytes())
        cached["targets"] = [*cached["targets"], 42, ("short",)]
        path.write_bytes(marshal.dumps(cached))
    return {}


def _plan_repaired(box: Box) -> None:
    for path in (box.cache / "plans").glob("*.plan"):
        assert plan._well_formed(marshal.loads(path.read_bytes()))


def _replacing_spec(box: Box) -> dict[str, str]:
    spec = Path(hook.__file__).resolve().parent.parent / "patches" / "facexlib" / "spec.toml"
    box.write("specs/facexlib.toml", spec.read_text(encoding="utf-8"))
    return {"DMLPATCH_PATCHES": str(box.inputs / "specs")}


def _exits_3(box: Box) -> dict[str, str]:
    box.write("exits_3.py", "import sys\nprint('ok')\nsys.exit(3)\n")
    return {}


@dataclass(frozen=True)
class Case:
    id: str
    item: str  # of issue #29
    argv: tuple[str, ...]
    code: int
    lines: tuple[str, ...]  # dmlpatch's lines on stderr, exactly ({box} is the sandbox)
    out: str = "ok\n"
    prepare: Callable[[Box], dict[str, str]] = lambda box: {}
    after: Optional[Callable[[Box], None]] = None
    untouched: tuple[str, ...] = ()  # directories (under the sandbox) that must stay as they were
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    Case(
        "cache-writable-by-others",
        "1",
        ("--device", "cpu", "{box.inputs}/ok.py"),
        0,
        (
            "dmlpatch: warning: cache directory {box.root}/shared is not used: {box.root}/shared "
            f"is writable by other users (mode 0777); {NOT_YOURS}",
            RUNNING,
        ),
        prepare=_shared_cache,
        untouched=("shared",),
    ),
    Case(
        "cache-of-another-user",
        "1",
        ("--device", "cpu", "{box.inputs}/ok.py"),
        0,
        (
            "dmlpatch: warning: cache directory {box.root}/theirs is not used: {box.root}/theirs "
            f"belongs to uid {OTHER_UID}, not to you (uid 0); {NOT_YOURS}",
            RUNNING,
        ),
        prepare=_cache_of_another_user,
        untouched=("theirs",),
    ),
    Case(
        "simulator-build-planted",
        "1",
        ("--device", "sim", "{box.inputs}/torch_ok.py"),
        2,
        (
            "dmlpatch: error: the simulated device's build directory {box.root}/tmp/dmlpatch-sim-0 "
            "is not used: {box.root}/tmp/dmlpatch-sim-0 belongs to uid 1002, not to you (uid 0); "
            f"{NOT_YOURS}",
        ),
        out="",
        prepare=_planted_simulator,
        untouched=("tmp",),
    ),
    Case(
        "verdicts-malformed",
        "3",
        ("--device", "cpu", "{box.inputs}/uses_mylib.py"),
        0,
        (RUNNING,),
        out="ok True\n",
        prepare=_malformed_verdicts,
        after=_verdict_repaired,
    ),
    Case(
        "plan-malformed",
        "3",
        ("--device", "cpu", "{box.inputs}/ok.py"),
        0,
        (RUNNING,),
        prepare=_malformed_plan,
        after=_plan_repaired,
    ),
    Case(
        "spec-replaces-builtin",
        "7",
        ("--device", "cpu", "{box.inputs}/ok.py"),
        0,
        (
            "dmlpatch: warning: patch spec 'facexlib' from DMLPATCH_PATCHES "
            "({box.inputs}/specs/facexlib.toml), replaces dmlpatch's own "
            f"({Path(hook.__file__).resolve().parent.parent}/patches/facexlib/spec.toml): it "
            "wraps facexlib.utils.misc:load_file_from_url with "
            "dmlpatch.patches.facexlib.fixes:download_hint and rewrites 12 module(s)",
            RUNNING,
        ),
        prepare=_replacing_spec,
    ),
    Case(
        "report-cannot-be-written",
        "7",
        ("--device", "cpu", "--report=/dev/full", "{box.inputs}/exits_3.py"),
        3,
        (
            RUNNING,
            "dmlpatch: warning: cannot write the report to '/dev/full': No space left on device; "
            "the exit code stays the program's",
        ),
        prepare=_exits_3,
    ),
    Case(
        "report-cannot-be-written-exit-0",
        "7",
        ("--device", "cpu", "--report=/dev/full", "{box.inputs}/ok.py"),
        0,
        (
            RUNNING,
            "dmlpatch: warning: cannot write the report to '/dev/full': No space left on device; "
            "the exit code stays the program's",
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_case(case: Case, box: Box) -> None:
    env = case.prepare(box)
    before = {name: _tree(box.root / name) for name in case.untouched}
    result = _run(box, list(case.argv), **env)
    assert result.code == case.code, result.err
    assert "Traceback" not in result.err
    assert result.out == case.out
    said = [line for line in result.err_lines if line.startswith("dmlpatch:")]
    assert said == [line.format(box=box) for line in case.lines]
    assert result.err_lines == said  # nothing but dmlpatch's lines
    assert os.listdir(box.work) == []
    for name, listing in before.items():
        assert _tree(box.root / name) == listing, name
    if case.after is not None:
        case.after(box)


def test_status_and_doctor_name_a_spec_that_replaces_dmlpatchs_own(box: Box) -> None:
    env = _replacing_spec(box)
    expected = (
        f"patch spec 'facexlib' from DMLPATCH_PATCHES ({box.inputs}/specs/facexlib.toml), "
        "replaces dmlpatch's own"
    )
    status = _run(box, ["status"], **env)
    assert status.code == 0, status.err
    assert [line for line in status.out.splitlines() if line.startswith("patches:")] == [
        f"patches: {expected} ({Path(hook.__file__).resolve().parent.parent}/patches/facexlib/"
        "spec.toml): it wraps facexlib.utils.misc:load_file_from_url with "
        "dmlpatch.patches.facexlib.fixes:download_hint and rewrites 12 module(s)"
    ]
    doctor = _run(box, ["doctor", "--no-import"], **env)
    assert f"WARN patches    {expected}" in doctor.out
    assert "fix: unset DMLPATCH_PATCHES to use dmlpatch's own" in doctor.out


def test_the_table_covers_the_items() -> None:
    assert {case.item for case in CASES} == {"1", "3", "7"}
    assert len({case.id for case in CASES}) == len(CASES)


# -- signals --------------------------------------------------------------------------------

ON_THE_DEVICE = """
import time
import torch
device = {device}
model = torch.nn.Linear(4, 4).to(device)
print("ready", model(torch.ones(2, 4, device=device)).device, flush=True)
time.sleep(60)
"""
CUDA_WAY = 'torch.device("cuda" if torch.cuda.is_available() else "cpu")'

#: How each entry point starts the program: command line, environment, program.
ENTRIES = {
    "runner": (["-m", "dmlpatch", "--device", "sim"], {}, ON_THE_DEVICE.format(device=CUDA_WAY)),
    "auto": (
        [],
        {"DMLPATCH_DEVICE": "sim"},
        "import dmlpatch.auto\n" + ON_THE_DEVICE.format(device=CUDA_WAY),
    ),
    "check": (
        ["-m", "dmlpatch", "check", "--device", "sim"],
        {},
        ON_THE_DEVICE.format(device=CUDA_WAY),
    ),
    "patch": (
        [],
        {},
        "import dmlpatch\ndmlpatch.patch('sim')\n"
        + ON_THE_DEVICE.format(device="dmlpatch.device()"),
    ),
    "activation": ([], {}, ON_THE_DEVICE.format(device=CUDA_WAY)),
}


@pytest.fixture(scope="module")
def activated() -> Iterator[str]:
    for python, _ in linked_venv():
        made = subprocess.run(
            [python, "-m", "dmlpatch", "activate", "--device", "sim"],
            env=clean_env(),
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stderr
        yield python


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_signal_ends_the_program_as_under_python(
    entry: str, signal_number: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Ctrl-C (SIGINT) and SIGTERM after the program has used the device: the process ends by
    that signal (130 and 143 in a shell), and Ctrl-C's traceback is the program's own."""
    argv, env, program = ENTRIES[entry]
    (tmp_path / "program.py").write_text(program)
    python = request.getfixturevalue("activated") if entry == "activation" else sys.executable
    child = subprocess.Popen(
        [python, *argv, "program.py"],
        cwd=tmp_path,
        env=clean_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "ready privateuseone:0\n"
    child.send_signal(signal_number)
    out, err = child.communicate(timeout=120)
    assert child.returncode == -signal_number, err
    if signal_number == signal.SIGINT:
        lines = err.splitlines()
        assert "KeyboardInterrupt" in lines, err
        assert err.count("Traceback (most recent call last):") == 1, err
        assert not [line for line in lines if line.startswith("  File") and "/dmlpatch/" in line]
    if entry == "check" and signal_number == signal.SIGINT:
        assert "verdict: interrupted (Ctrl-C) before the program finished" in out + err


# -- the main script's globals --------------------------------------------------------------

GLOBALS = """
import builtins
names = [(name, type(value).__name__) for name, value in globals().items()]
print(names, __builtins__ is builtins, __builtins__.len("ab"))
"""


@pytest.mark.parametrize("how", ["script", "module"])
def test_the_main_globals_are_pythons(how: str, tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(GLOBALS)
    target = ["program.py"] if how == "script" else ["-m", "program"]
    runs = {}
    for name, prefix in (("python", []), ("dmlpatch", ["-m", "dmlpatch", "--device", "cpu"])):
        completed = subprocess.run(
            [sys.executable, *prefix, *target],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
        )
        assert completed.returncode == 0, completed.stderr
        runs[name] = completed.stdout
    assert runs["dmlpatch"] == runs["python"]
    assert runs["python"].rstrip().endswith("True 2")


# -- permissions under the umask ------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["022", "002"])
def test_what_dmlpatch_writes_is_private_whatever_the_umask(umask: int, box: Box) -> None:
    """Caches: directories 0700, files 0600; rewritten bytecode readable like its source but
    writable by its owner only (the source is group-writable under umask 002)."""
    (box.inputs / "mylib.py").chmod(0o666 & ~umask)  # as an install under this umask leaves it
    env = clean_env(DMLPATCH_CACHE_DIR=str(box.cache / "fresh"))
    del env["PYTHONDONTWRITEBYTECODE"]
    completed = subprocess.run(
        [sys.executable, "-m", "dmlpatch", "--device", "cpu", str(box.inputs / "uses_mylib.py")],
        cwd=box.work,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(umask),
    )
    assert completed.returncode == 0, completed.stderr
    made = box.cache / "fresh"
    modes = {
        str(path.relative_to(made)): stat.S_IMODE(path.stat().st_mode)
        for path in [made, *made.rglob("*")]
    }
    assert {"plans", "discovery"} <= set(modes), modes
    for name, mode in modes.items():
        expected = 0o700 if (made / name).is_dir() else 0o600
        assert mode == expected, (name, oct(mode))
    rewritten = [p for p in box.inputs.rglob("*.pyc") if "opt-dmlpatch" in p.name]
    assert [p.name.split(".")[0] for p in rewritten] == ["mylib"]
    assert stat.S_IMODE(rewritten[0].stat().st_mode) == 0o644
