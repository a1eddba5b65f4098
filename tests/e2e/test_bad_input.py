"""Bad input to every command and environment variable: one line, the documented exit code.

Each case runs ``python -m dmlpatch`` in a subprocess from an empty working directory, with
HOME, XDG_CACHE_HOME and DMLPATCH_CACHE_DIR pointing at empty directories, and checks:

- the exit code is the documented one (2 for dmlpatch's errors; 0 where dmlpatch only warns
  or there is nothing to do; 1 where the error is the program's own, as with plain python);
- dmlpatch's message is exactly one line (``dmlpatch: error: ...`` for errors);
- there is no traceback (``DMLPATCH_DEBUG=1`` adds dmlpatch's: the last test);
- nothing was written: the working, home and cache directories stay empty (a program that
  runs may leave dmlpatch's plan cache, ``plans/``), the inputs are unchanged.

``CASES`` is also the documentation's Errors table (docs/reference/errors.md);
``test_documented_table_matches`` keeps them in step.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from support import REPO, Result, clean_env, linked_venv, run_python

ERROR, WARNING, NOTE, PROGRAM = "error", "warning", "note", "program"
SIM, VENV, NOBODY = "sim", "venv", "nobody"


@dataclass(frozen=True)
class Case:
    """One bad input: ``{inputs}`` in ``argv`` and ``env`` is the directory of prepared files."""

    id: str
    argv: tuple[str, ...]
    code: int
    message: str  # a regular expression searched in dmlpatch's one line (or the program's last)
    env: dict[str, str] = field(default_factory=dict)
    kind: str = ERROR  # error | warning (the program runs) | note | program (its own error)
    needs: frozenset[str] = frozenset()  # sim (the built simulator), venv, nobody
    cache: frozenset[str] = frozenset()  # what may appear in the empty cache directory


OK = "{inputs}/ok.py"
# Checks that need torch are made when the program first imports it (settings a program makes
# before its own import of torch must hold), so their cases run a program that imports it.
TORCH_OK = "{inputs}/torch_ok.py"
RUNS = frozenset({"plans"})  # a program that runs leaves dmlpatch's plan cache
# ... and one that imports torch, discovery's verdicts on the libraries torch imports
TORCH_RUNS = RUNS | {"discovery"}

CASES = [
    # device specs
    Case("device-unknown", ("--device", "gpu", OK), 2, r"unknown device spec 'gpu'; expected"),
    Case("device-trailing-comma", ("--device", "dml:x,", OK), 2, r"listed by index, e\.g\. dml:0"),
    Case("device-negative-index", ("--device", "sim:-1", OK), 2, r"sim takes an adapter index"),
    Case("device-cuda-name", ("--device", "cuda:abc", OK), 2, r"cuda takes an adapter index"),
    Case(
        "device-privateuseone-name",
        ("--device", "privateuseone:x", OK),
        2,
        r"^dmlpatch: error: device spec 'privateuseone:x': privateuseone takes an adapter index "
        r"such as privateuseone:0 \(only dml takes an adapter name\)$",
    ),
    Case("device-no-value", ("--device",), 2, r"--device needs a value"),
    Case("device-env-unknown", (OK,), 2, r"unknown device spec 'gpu'", {"DMLPATCH_DEVICE": "gpu"}),
    Case("device-dml-missing", ("--device", "dml", OK), 2, r"torch-directml is not installed"),
    Case("scope-unknown", ("--scope", "most", OK), 2, r"unknown scope 'most'; expected one of"),
    Case("scope-no-value", ("--scope",), 2, r"--scope needs a value: all, project or specs"),
    Case("scope-env-unknown", (OK,), 2, r"unknown scope 'most'", {"DMLPATCH_SCOPE": "most"}),
    Case(
        "bf16-unknown",
        ("--bf16", "half", OK),
        2,
        r"--bf16 'half': bfloat16 runs on DirectML as float32 or float16; choose one of "
        r"float32, float16",
    ),
    Case("bf16-no-value", ("--bf16",), 2, r"--bf16 needs a value: float32 or float16"),
    Case(
        "bf16-env-unknown",
        (OK,),
        2,
        r"DMLPATCH_BF16='bf16': bfloat16 runs on DirectML as float32 or float16",
        {"DMLPATCH_BF16": "bf16"},
    ),
    Case(
        "device-sim-adapter",
        ("--device", "sim:5", OK),
        2,
        r"simulated DirectML adapter 5 does not exist \(1 adapter\(s\)",
        needs=frozenset({SIM}),
    ),
    # profiles
    Case(
        "profile-unknown",
        ("--device", "sim", OK),
        2,
        r"unknown simulated-device profile 'bogus'; valid profiles: ",
        {"DMLPATCH_SIM_PROFILE": "bogus"},
    ),
    Case(
        "check-profile-unknown",
        ("check", "--profile", "bogus", OK),
        2,
        r"unknown simulated-device profile 'bogus'",
    ),
    Case(
        "check-profile-not-sim",
        ("check", "--device", "dml", "--profile", "permissive", OK),
        2,
        r"--profile chooses a simulated DirectML release; it needs --device sim",
    ),
    # scripts and commands
    Case("script-missing", ("{inputs}/missing.py",), 2, r"can't open file '.*missing\.py': no"),
    Case("script-directory", ("{inputs}/adir",), 2, r"can't find '__main__' module in '.*adir'"),
    Case(
        "script-unreadable",
        ("{inputs}/unreadable.py",),
        2,
        r"can't open file '.*unreadable\.py': permission denied",
        needs=frozenset({NOBODY}),
    ),
    Case(
        "script-syntax-error",
        ("--device", "cpu", "{inputs}/syntax.py"),
        1,
        r"^SyntaxError: invalid syntax$",
        kind=PROGRAM,
        cache=RUNS,
    ),
    Case(
        "script-not-utf8",
        ("--device", "cpu", "{inputs}/latin1.py"),
        1,
        r"^SyntaxError: \(unicode error\) 'utf-8' codec can't decode",
        kind=PROGRAM,
        cache=RUNS,
    ),
    Case("no-script", (), 2, r"no script given; usage: python -m dmlpatch"),
    Case("unknown-command", ("frobnicate",), 2, r"'frobnicate' is neither a dmlpatch command"),
    Case("unknown-option", ("--bogus", OK), 2, r"unknown option '--bogus'; see dmlpatch --help"),
    Case("module-missing", ("-m", "no_such_module"), 2, r"^dmlpatch: error: No module named no_"),
    Case(
        "module-under-a-module",
        ("-m", "json.decoder.nosuch"),
        2,
        r"^dmlpatch: error: Error while finding module specification for 'json\.decoder\.nosuch' "
        r"\(__path__ attribute not found on 'json\.decoder' while trying to find "
        r"'json\.decoder\.nosuch'\)$",
    ),
    Case("module-no-name", ("-m",), 2, r"-m needs a module name"),
    Case("module-relative", ("-m", ".relative"), 2, r"Relative module names not supported"),
    Case("run-unknown", ("run", "no-such-command"), 2, r"no console script named 'no-such-comm"),
    Case("run-no-command", ("run",), 2, r"dmlpatch run needs a command"),
    # reports
    Case(
        "report-no-directory",
        ("--report=/nonexistent/dir/x.json", OK),
        2,
        r"cannot write the report to '/nonexistent/dir/x\.json': no directory '/nonexistent/dir'",
    ),
    Case(
        "report-env-no-directory",
        (OK,),
        2,
        r"cannot write the report to '/nonexistent/dir/x\.json'",
        {"DMLPATCH_REPORT": "/nonexistent/dir/x.json"},
    ),
    Case("report-is-directory", ("--report={inputs}/adir", OK), 2, r"adir': it is a directory"),
    # patch specs and packs
    Case(
        "spec-bad-toml",
        ("--device", "cpu", OK),
        2,
        r"patch spec .*bad-toml/x\.toml: not valid TOML",
        {"DMLPATCH_PATCHES": "{inputs}/specs/bad-toml"},
    ),
    Case(
        "spec-missing-field",
        ("--device", "cpu", OK),
        2,
        r"missing-field/x\.toml: field 'rewrite\[0\]\.why' is missing",
        {"DMLPATCH_PATCHES": "{inputs}/specs/missing-field"},
    ),
    Case(
        "spec-wrong-type",
        ("--device", "cpu", OK),
        2,
        r"wrong-type/x\.toml: field 'package\.versions' must be a version specifier string",
        {"DMLPATCH_PATCHES": "{inputs}/specs/wrong-type"},
    ),
    Case(
        "spec-directory-missing",
        ("--device", "cpu", OK),
        2,
        r"DMLPATCH_PATCHES names '/nonexistent', which is not a directory",
        {"DMLPATCH_PATCHES": "/nonexistent"},
    ),
    Case(
        "spec-disable-unknown",
        ("--device", "cpu", OK),
        0,
        r"DMLPATCH_DISABLE_PATCHES names 'no-such-spec', but no patch spec or pack has that name",
        {"DMLPATCH_DISABLE_PATCHES": "facexlib,no-such-spec"},
        kind=WARNING,
        cache=RUNS,
    ),
    Case(
        "pack-fails-to-load",
        ("--device", "cpu", OK),
        0,
        r"patch pack 'brokenpack' skipped: it failed to load \(brokenpack_is_not_installed",
        {"PYTHONPATH": "{inputs}/packs/broken"},
        kind=WARNING,
        cache=RUNS,
    ),
    Case(
        "pack-bad-spec",
        ("--device", "cpu", OK),
        0,
        r"patch pack 'badspecpack' skipped: patch spec .*x\.toml: not valid TOML",
        {"PYTHONPATH": "{inputs}/packs/badspec"},
        kind=WARNING,
        cache=RUNS,
    ),
    # environment variables of the simulated device, the op fixes and the cache
    Case(
        "sim-devices-zero",
        ("--device", "sim", OK),
        2,
        r"DMLPATCH_SIM_DEVICES must be a whole number >= 1, got '0'",
        {"DMLPATCH_SIM_DEVICES": "0"},
    ),
    Case(
        "sim-devices-not-a-number",
        ("--device", "sim", OK),
        2,
        r"DMLPATCH_SIM_DEVICES must be a whole number >= 1, got 'abc'",
        {"DMLPATCH_SIM_DEVICES": "abc"},
    ),
    Case(
        "sim-fault-unknown",
        ("--device", "sim", OK),
        2,
        r"unknown DMLPATCH_SIM_FAULT 'bogus'; valid values: drop-scalar-writes",
        {"DMLPATCH_SIM_FAULT": "bogus"},
    ),
    Case(
        "cpu-ops-not-an-op",
        ("--device", "sim", TORCH_OK),
        2,
        r"DMLPATCH_CPU_OPS: 'index_add' is not an operator name like aten::index_add",
        {"DMLPATCH_CPU_OPS": "index_add"},
        needs=frozenset({SIM}),
        cache=TORCH_RUNS,
    ),
    Case(
        "cpu-ops-unknown-op",
        ("--device", "sim", TORCH_OK),
        2,
        r"DMLPATCH_CPU_OPS: no operator named 'aten::no_such_op'",
        {"DMLPATCH_CPU_OPS": "aten::no_such_op"},
        needs=frozenset({SIM}),
        cache=TORCH_RUNS,
    ),
    Case(
        "cpu-ops-composite",
        ("--device", "sim", TORCH_OK),
        2,
        r"DMLPATCH_CPU_OPS: aten::linear never reaches the device: PyTorch composes it of other "
        r"operators; name those instead \(aten::addmm, aten::mm\)",
        {"DMLPATCH_CPU_OPS": "aten::linear"},
        needs=frozenset({SIM}),
        cache=TORCH_RUNS,
    ),
    Case(
        "cache-dir-is-a-file",
        ("--device", "cpu", OK),
        0,
        r"^dmlpatch: running on cpu: requested with --device cpu$",
        {"DMLPATCH_CACHE_DIR": "{inputs}/ok.py"},
        kind=NOTE,
    ),
    # the other commands
    Case("check-script-missing", ("check", "{inputs}/missing.py"), 2, r"can't open file '.*miss"),
    Case("check-no-program", ("check",), 2, r"dmlpatch check needs a program"),
    Case("check-device-cpu", ("check", "--device", "cpu", OK), 2, r"runs on sim or dml, not 'cpu'"),
    Case(
        "check-json-no-directory",
        ("check", "--json", "/nonexistent/dir/x.json", OK),
        2,
        r"cannot write the report to '/nonexistent/dir/x\.json': no directory",
    ),
    Case("scan-missing-package", ("scan", "no_such_package"), 2, r"no installed package or path"),
    Case("scan-missing-path", ("scan", "/nonexistent/p"), 2, r"neither an existing path nor a pa"),
    Case("scan-no-target", ("scan",), 2, r"usage: dmlpatch scan PACKAGE\|PATH \[--spec\]"),
    Case(
        "doctor-unknown-flag",
        ("doctor", "--bogus"),
        2,
        r"doctor takes only --json, --no-import and --failures",
    ),
    Case("list-unknown-flag", ("list", "--bogus"), 2, r"list takes only --json; unexpected '--b"),
    Case("status-unknown-flag", ("status", "--bogus"), 2, r"status takes only --json; unexpect"),
    Case(
        "activate-bad-device",
        ("activate", "--device", "gpu"),
        2,
        r"unknown device spec 'gpu'",
        needs=frozenset({VENV}),
    ),
    Case(
        "activate-extra-argument",
        ("activate", "extra"),
        2,
        r"activate takes only --device and --pin; unexpected 'extra'",
        needs=frozenset({VENV}),
    ),
    Case(
        "activate-read-only",
        ("activate",),
        2,
        r"cannot write to .*site-packages: Permission denied; activate needs a writable",
        needs=frozenset({VENV, NOBODY}),
    ),
    Case(
        "deactivate-not-active",
        ("deactivate",),
        0,
        r"^dmlpatch: not activated in this environment \(.*dmlpatch-activate\.pth absent\); "
        r"nothing to do$",
        kind=NOTE,
        needs=frozenset({VENV}),
    ),
    Case(
        "deactivate-extra-argument",
        ("deactivate", "now"),
        2,
        r"deactivate takes no arguments; unexpected 'now'",
        needs=frozenset({VENV}),
    ),
    Case(
        "pin-no-directml",
        ("pin",),
        0,
        r"^dmlpatch: torch-directml is not installed in this environment \(.*\); nothing to pin$",
        kind=NOTE,
        needs=frozenset({VENV}),
    ),
    Case(
        "pin-extra-argument",
        ("pin", "torch==2.4.1"),
        2,
        r"pin takes no arguments; unexpected 'torch==2\.4\.1'",
        needs=frozenset({VENV}),
    ),
    Case(
        "unpin-not-pinned",
        ("unpin",),
        0,
        r"^dmlpatch: not pinned in this environment \(.*dmlpatch-pin absent\); nothing to do$",
        kind=NOTE,
        needs=frozenset({VENV}),
    ),
    Case(
        "unpin-extra-argument",
        ("unpin", "now"),
        2,
        r"unpin takes no arguments; unexpected 'now'",
        needs=frozenset({VENV}),
    ),
]

BY_ID = {case.id: case for case in CASES}

#: Raised in different layers (options, runner, resolution, specs, simulator, commands).
DEBUG_IDS = [
    "device-unknown",
    "script-missing",
    "report-no-directory",
    "spec-bad-toml",
    "sim-devices-zero",
    "check-no-program",
    "scan-missing-package",
]


def _prepare_inputs(inputs: Path) -> None:
    files = {
        "ok.py": b"print('ok')\n",
        "torch_ok.py": b"import torch\nprint('ok')\n",
        "syntax.py": b"def f(:\n    pass\n",
        "latin1.py": b"name = '\xe9t\xe9'\nprint(name)\n",
        "unreadable.py": b"print('secret')\n",
        "adir/data.txt": b"a directory without __main__.py\n",
        "specs/bad-toml/x.toml": b"[package\nname = 'x'\n",
        "specs/missing-field/x.toml": b"[package]\nname = 'x'\n[[rewrite]]\nmodules = ['x.y']\n",
        "specs/wrong-type/x.toml": (
            b"[package]\nname = 'x'\nversions = 3\n[[rewrite]]\nmodules = ['x.y']\nwhy = 'w'\n"
        ),
        "packs/broken/brokenpack-0.1.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: brokenpack\nVersion: 0.1\n"
        ),
        "packs/broken/brokenpack-0.1.dist-info/entry_points.txt": (
            b"[dmlpatch.patches]\nbrokenpack = brokenpack_is_not_installed.specs\n"
        ),
        "packs/badspec/badspecpack-0.1.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: badspecpack\nVersion: 0.1\n"
        ),
        "packs/badspec/badspecpack-0.1.dist-info/entry_points.txt": (
            b"[dmlpatch.patches]\nbadspecpack = badspecpack\n"
        ),
        "packs/badspec/badspecpack/__init__.py": b"",
        "packs/badspec/badspecpack/x.toml": b"[package\n",
    }
    for relative, content in files.items():
        path = inputs / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (inputs / "unreadable.py").chmod(0)


def _tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry under ``root``: mode, modification time and content hash (links unfollowed)."""
    found: dict[str, tuple[int, int, str]] = {}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = Path(directory, name)
            status = path.lstat()
            digest = ""
            if stat.S_ISREG(status.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(root))] = (status.st_mode, status.st_mtime_ns, digest)
    return found


@dataclass
class Sandbox:
    root: Path
    work: Path
    home: Path
    xdg: Path
    cache: Path
    inputs: Path


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """Outside pytest's private (0700) temporary root, so that user nobody can reach it; the
    empty directories are world-writable, so that a stray write as nobody would show too. The
    cache is private to whoever runs the case (dmlpatch uses no cache others could write)."""
    root = Path(tempfile.mkdtemp(prefix="bad-input-"))
    root.chmod(0o755)
    box = Sandbox(root, *(root / name for name in ("work", "home", "xdg", "cache", "inputs")))
    for directory in (box.work, box.home, box.xdg, box.cache):
        directory.mkdir()
        directory.chmod(0o700 if directory == box.cache else 0o777)
    _prepare_inputs(box.inputs)
    try:
        yield box
    finally:
        shutil.rmtree(root)


@pytest.fixture(scope="module")
def venv() -> Iterator[tuple[str, Path]]:
    yield from linked_venv()


@pytest.fixture(scope="module")
def built_sim() -> Path:
    """The shared cache's ``sim`` directory with the simulator built (first use: a build)."""
    result = run_python(
        ["-c", "from dmlpatch.sim import build; print(build.ensure_built())"], timeout=900
    )
    assert result.code == 0, f"the simulated device must build here: {result.err[-300:]}"
    return Path(result.out.strip()).parent.parent


def _can_drop_privileges() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv") is not None


def _run(case: Case, box: Sandbox, request: pytest.FixtureRequest, **extra: str) -> Result:
    python = sys.executable
    if VENV in case.needs:
        python = request.getfixturevalue("venv")[0]
    if SIM in case.needs:
        os.symlink(request.getfixturevalue("built_sim"), box.cache / "sim")
    prefix: list[str] = []
    if NOBODY in case.needs:
        # The suite runs as root with setpriv (CI included), as tests/e2e/test_activation.py does.
        assert _can_drop_privileges(), "dropping to user nobody needs root and setpriv"
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(box.cache, nobody.pw_uid, nobody.pw_gid)
    env = clean_env(
        HOME=str(box.home), XDG_CACHE_HOME=str(box.xdg), DMLPATCH_CACHE_DIR=str(box.cache)
    )
    env.update({k: v.format(inputs=box.inputs) for k, v in case.env.items()})
    env.update(extra)
    argv = [a.format(inputs=box.inputs) for a in case.argv]
    completed = subprocess.run(
        [*prefix, python, "-m", "dmlpatch", *argv],
        env=env,
        cwd=box.work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Result(completed.returncode, completed.stdout, completed.stderr)


def _check_nothing_written(
    case: Case, box: Sandbox, inputs_before: dict, purelib: Optional[Path], purelib_before: set
) -> None:
    assert os.listdir(box.work) == []
    assert os.listdir(box.home) == []
    assert os.listdir(box.xdg) == []
    allowed = case.cache | ({"sim"} if SIM in case.needs else set())
    assert set(os.listdir(box.cache)) <= allowed
    assert _tree(box.inputs) == inputs_before
    if purelib is not None:
        assert set(os.listdir(purelib)) == purelib_before


def _check_message(case: Case, result: Result) -> None:
    lines = result.err_lines
    if case.kind == ERROR:
        assert result.out == ""
        assert len(lines) == 1, result.err
        assert lines[0].startswith("dmlpatch: error: ")
        assert re.search(case.message, lines[0]), lines[0]
    elif case.kind == WARNING:
        assert result.out == "ok\n"
        warnings = [line for line in lines if line.startswith("dmlpatch: warning: ")]
        assert len(warnings) == 1, result.err
        assert re.search(case.message, warnings[0]), warnings[0]
        assert all(line.startswith("dmlpatch: ") for line in lines), result.err
        assert not any(line.startswith("dmlpatch: error") for line in lines), result.err
    elif case.kind == NOTE:
        assert len(lines) == 1, result.err
        assert re.search(case.message, lines[0]), lines[0]
    else:  # the program's own error, printed as Python prints it
        assert not any(line.startswith("dmlpatch: error") for line in lines), result.err
        assert re.search(case.message, lines[-1]), result.err
        assert not any("/dmlpatch/" in line for line in lines if line.startswith("  File ")), (
            result.err
        )


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input(case: Case, sandbox: Sandbox, request: pytest.FixtureRequest) -> None:
    purelib = request.getfixturevalue("venv")[1] if VENV in case.needs else None
    purelib_before = set(os.listdir(purelib)) if purelib is not None else set()
    inputs_before = _tree(sandbox.inputs)
    result = _run(case, sandbox, request)
    assert result.code == case.code, result.err
    assert "Traceback" not in result.out + result.err
    _check_message(case, result)
    _check_nothing_written(case, sandbox, inputs_before, purelib, purelib_before)


@pytest.mark.parametrize("case_id", DEBUG_IDS)
def test_debug_shows_dmlpatch_traceback(
    case_id: str, sandbox: Sandbox, request: pytest.FixtureRequest
) -> None:
    case = BY_ID[case_id]
    inputs_before = _tree(sandbox.inputs)
    result = _run(case, sandbox, request, DMLPATCH_DEBUG="1")
    assert result.code == case.code, result.err
    assert "Traceback (most recent call last):" in result.err
    assert re.search(r'File ".*/dmlpatch/[a-z_/]+\.py", line \d+', result.err), result.err
    last = result.err_lines[-1]
    assert last.startswith("dmlpatch: error: ") and re.search(case.message, last), result.err
    _check_nothing_written(case, sandbox, inputs_before, None, set())


def _documented_rows() -> dict[str, int]:
    section = (REPO / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    rows = {}
    for line in section.splitlines():
        match = re.match(r"^\| `(?P<id>[a-z0-9-]+)` \|.*\| (?P<code>\d) \|$", line)
        if match:
            rows[match.group("id")] = int(match.group("code"))
    return rows


def test_documented_table_matches() -> None:
    """The documentation's Errors table lists every case, with the same exit code, and no
    other."""
    assert _documented_rows() == {case.id: case.code for case in CASES}


def test_table_is_broad() -> None:
    assert len(CASES) >= 24 and len(BY_ID) == len(CASES)
