"""Pin protection: real pip in a throw-away venv keeps a torch-directml-like pin.

Each venv has its own pip (ensurepip, offline) and sees dmlpatch's sources, nothing of .venv:
the wheels pip installs — a ``torch-directml`` whose metadata pins ``torch==2.4.1`` and
``torchvision==0.19.1``, fake ``torch`` 2.4.1 and 2.5.0, libraries that want one or the other —
are built here and found with ``--no-index --find-links``. Its path holds a space (pip splits
configuration values on whitespace). HOME, XDG_CONFIG_HOME and XDG_CONFIG_DIRS point at a
user-level and a global-level pip configuration of the test, which must stay byte-identical,
and no ``PIP_*`` variable of the machine reaches pip.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import packaging
import pytest

from dmlpatch.commands import cli
from dmlpatch.pinning import pip_config

from support import REPO, Result, clean_env, run_python

PINNED = "The user requested (constraint) torch==2.4.1"


def _refused(what: str) -> str:
    """The line dmlpatch adds after pip's refusal, in pip's process."""
    return (
        f"dmlpatch: pip refused {what}: torch==2.4.1 is torch-directml's own, kept in this "
        "environment by `dmlpatch pin`; install a version that accepts torch==2.4.1, or run "
        "`dmlpatch unpin` first (DirectML then fails until torch-directml's torch is back)"
    )


def _said(result: Result) -> list[str]:
    return [line for line in result.err_lines if line.startswith("dmlpatch:")]


NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
WHEELS = (
    ("torch", "2.4.1", ()),
    ("torch", "2.5.0", ()),
    ("torchvision", "0.19.1", ("torch==2.4.1",)),
    ("torchvision", "0.20.0", ("torch==2.5.0",)),
    ("torch-directml", "0.2.5.dev240914", ("torch==2.4.1", "torchvision==0.19.1")),
    ("needs-new-torch", "1.0", ("torch>=2.5",)),
    ("fine-with-torch", "1.0", ("torch>=2.0",)),
    ("capped", "1.0", ()),
    ("capped", "2.0", ()),
)


def _wheel(directory: Path, name: str, version: str, requires: tuple[str, ...]) -> None:
    """A pure-Python wheel with one module and the given Requires-Dist."""
    stem = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{name.replace('-', '_')}/__init__.py": f"__version__ = {version!r}\n",
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
        f"{stem}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test_pin\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}\n")
    files[f"{stem}.dist-info/RECORD"] = "".join(record) + f"{stem}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{stem}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    for name, version, requires in WHEELS:
        _wheel(directory, name, version, requires)
    return directory


class Env:
    """A venv with its own pip, and pip configuration files outside it that must not change."""

    def __init__(self, root: Path, wheels: Path) -> None:
        self.prefix = root / "env with space"
        venv.EnvBuilder(with_pip=True).create(self.prefix)
        self.python = str(self.prefix / "bin" / "python")
        purelib = Path(self._ask("import sysconfig; print(sysconfig.get_paths()['purelib'])"))
        self.purelib = purelib
        (purelib / "_dmlpatch_sources.pth").write_text(f"{REPO / 'src'}\n")
        # dmlpatch's one dependency these commands use; pip itself never sees it as installed.
        (purelib / "packaging").symlink_to(Path(packaging.__file__).parent)
        self.wheels = wheels
        self.site_file = self.prefix / "pip.conf"
        config = root / "config"
        self.user_file = config / "user" / "pip" / "pip.conf"
        self.global_file = config / "global" / "pip" / "pip.conf"
        self.capped = config / "capped.txt"
        self.user_file.parent.mkdir(parents=True)
        self.capped.write_text("capped<2\n")
        self.user_file.write_bytes(b"# the user's own\n[global]\ntimeout = 30\n")
        self.global_file.parent.mkdir(parents=True)
        self.global_file.write_bytes(f"[global]\nconstraint = {self.capped}\n".encode())
        self.env = {k: v for k, v in clean_env().items() if not k.startswith("PIP_")}
        self.env.update(
            HOME=str(root / "home"),
            XDG_CONFIG_HOME=str(self.user_file.parent.parent),
            XDG_CONFIG_DIRS=str(self.global_file.parent.parent),
            PIP_DISABLE_PIP_VERSION_CHECK="1",
        )
        self.outside = self.digests()

    def _ask(self, code: str) -> str:
        return subprocess.run(
            [self.python, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()

    def run(self, *args: str, **extra: str) -> Result:
        return run_python(list(args), python=self.python, env={**self.env, **extra})

    def pip(self, *args: str, **extra: str) -> Result:
        options = ("--no-index", "--find-links", str(self.wheels))
        return self.run("-m", "pip", "install", *options, *args, **extra)

    def dmlpatch(self, *args: str, **extra: str) -> Result:
        return self.run("-m", "dmlpatch", *args, **extra)

    def version(self, name: str) -> Optional[str]:
        code = (
            "import importlib.metadata as m, sys\n"
            "try: print(m.version(sys.argv[1]))\n"
            "except m.PackageNotFoundError: print('-')"
        )
        found = self.run("-c", code, name).out.strip()
        return None if found == "-" else found

    def listing(self) -> set[str]:
        return {p.name for p in self.prefix.iterdir()}

    def digests(self) -> dict[str, str]:
        """Every pip configuration file outside the venv that this pip reads."""
        return {
            str(path): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in (self.user_file, self.global_file, self.capped)
        }


@pytest.fixture
def env(wheels: Path) -> Iterator[Env]:
    # Outside pytest's private (0700) temporary root, so that user nobody can reach it.
    root = Path(tempfile.mkdtemp(prefix="dmlpatch-pin-"))
    root.chmod(0o755)
    try:
        yield Env(root, wheels)
    finally:
        shutil.rmtree(root)


def _installed(env: Env) -> Env:
    result = env.pip("torch-directml==0.2.5.dev240914")
    assert result.code == 0, result.err
    assert (env.version("torch"), env.version("torchvision")) == ("2.4.1", "0.19.1")
    return env


def test_pin_keeps_torch_and_unpin_gives_pip_back(env: Env) -> None:
    before = env.listing()
    nothing = env.dmlpatch("pin")
    assert nothing.code == 0
    assert nothing.err_lines == [
        f"dmlpatch: torch-directml is not installed in this environment ({env.prefix}); "
        "nothing to pin"
    ]
    assert env.listing() == before

    _installed(env)
    pinned = env.dmlpatch("pin")
    assert pinned.code == 0, pinned.err
    assert pinned.err_lines[0].startswith(
        "dmlpatch: pinned torch==2.4.1, torchvision==0.19.1 (torch-directml 0.2.5.dev240914's "
        f"requirements) for every pip install in this environment: {env.site_file} names "
    )
    assert env.listing() - before == {"pip.conf", "dmlpatch-pin"}

    assert (env.purelib / "dmlpatch-pin.pth").is_file()
    refused = env.pip("needs-new-torch")
    assert refused.code == 1
    assert "needs-new-torch 1.0 depends on torch>=2.5" in refused.out
    assert PINNED in refused.out
    assert "ERROR: Cannot install needs-new-torch==1.0" in refused.err
    assert _said(refused) == [_refused("needs-new-torch==1.0")]
    assert refused.err_lines[-1] == _refused("needs-new-torch==1.0")  # after pip's own lines
    assert env.version("needs-new-torch") is None
    quiet = env.pip("-q", "needs-new-torch")
    assert quiet.code == 1 and _said(quiet) == [_refused("needs-new-torch==1.0")]
    direct = env.pip("torch==2.5.0")
    assert PINNED in direct.out
    assert _said(direct) == [_refused("torch==2.5.0")]
    # The `pip` console script too (the .pth tells pip's processes by their argv).
    script = str(env.prefix / "bin" / "pip")
    console = env.run(
        script, "install", "--no-index", "--find-links", str(env.wheels), "needs-new-torch"
    )
    assert console.code == 1 and _said(console) == [_refused("needs-new-torch==1.0")]
    upgraded = env.pip("--upgrade", "torch", "torchvision")
    assert upgraded.code == 0, upgraded.err
    assert (env.version("torch"), env.version("torchvision")) == ("2.4.1", "0.19.1")

    fine = env.pip("fine-with-torch")
    assert fine.code == 0, fine.err
    assert _said(fine) == []
    assert env.version("fine-with-torch") == "1.0"
    # The global-level constraint still holds: the site file's key carries it along.
    capped = env.pip("capped==2.0")
    assert capped.code == 1 and "The user requested (constraint) capped<2" in capped.out
    assert _said(capped) == []  # not the pin: pip's own words only

    status = env.dmlpatch("status")
    assert status.code == 0
    assert (
        f"pin: torch==2.4.1, torchvision==0.19.1 for every pip install here ({env.site_file}); "
        f"pip refuses a library that needs another torch with '{PINNED}': that is this pin "
        "(dmlpatch unpin lifts it)"
    ) in status.out.splitlines()
    doctor = env.dmlpatch("doctor", "--json", "--no-import")
    check = next(c for c in json.loads(doctor.out)["checks"] if c["area"] == "pin")
    assert check["status"] == "OK" and PINNED in check["message"]
    assert check["details"]["pins"] == ["torch==2.4.1", "torchvision==0.19.1"]

    unpinned = env.dmlpatch("unpin")
    assert unpinned.code == 0
    assert unpinned.err_lines == [
        f"dmlpatch: unpinned: removed {env.site_file} (dmlpatch pin had created it); "
        "pip may replace torch again"
    ]
    assert env.listing() == before
    assert not (env.purelib / "dmlpatch-pin.pth").exists()
    replaced = env.pip("needs-new-torch")
    assert replaced.code == 0, replaced.out + replaced.err
    assert _said(replaced) == []
    assert env.version("torch") == "2.5.0"
    assert env.digests() == env.outside

    # Pinning where torch was already replaced says how to put torch-directml's back.
    again = env.dmlpatch("pin")
    assert "dmlpatch: warning: torch 2.5.0, not torch==2.4.1: pip install torch==2.4.1 " in (
        again.err
    )
    assert env.dmlpatch("unpin").code == 0
    assert env.dmlpatch("unpin").err_lines == [
        f"dmlpatch: not pinned in this environment ({env.prefix / 'dmlpatch-pin'} absent); "
        "nothing to do"
    ]
    assert env.digests() == env.outside


USER_SITE_FILE = (
    b"# the environment's own settings\r\n"
    b"[global]\r\n"
    b"timeout = 30\r\n"
    b"\r\n"
    b"[install]\r\n"
    b"; keep capped old\r\n"
    b"constraint = {capped}\r\n"
    b"no-compile = yes\r\n"
)


def test_a_site_file_of_the_user_is_merged_and_given_back_byte_for_byte(env: Env) -> None:
    _installed(env)
    original = USER_SITE_FILE.replace(b"{capped}", str(env.capped).encode())
    env.site_file.write_bytes(original)
    env.site_file.chmod(0o600)
    # Without its own constraint key in [install], the global-level one would not be read.
    env.global_file.write_bytes(b"[global]\ntimeout = 10\n")
    env.outside = env.digests()

    assert env.dmlpatch("pin").code == 0
    merged = env.site_file.read_bytes()
    assert merged.startswith(original.split(b"no-compile")[0])  # theirs, then ours appended
    assert b"no-compile = yes\r\n" in merged and b"\n" not in merged.replace(b"\r\n", b"")
    assert PINNED in env.pip("needs-new-torch").out
    assert "The user requested (constraint) capped<2" in env.pip("capped==2.0").out

    assert env.dmlpatch("unpin").code == 0
    assert env.site_file.read_bytes() == original
    assert env.site_file.stat().st_mode & 0o777 == 0o600

    # Changed while pinned (here as `pip config --site set` would): only the pin goes.
    assert env.dmlpatch("pin").code == 0
    changed = env.run("-m", "pip", "config", "--site", "set", "global.retries", "7")
    assert changed.code == 0, changed.err
    result = env.dmlpatch("unpin")
    assert result.code == 0 and "keeping the changes made since the pin" in result.err
    parser = pip_config.parse(env.site_file.read_bytes(), "site")
    assert pip_config.constraints(parser, "install") == [str(env.capped)]
    assert parser.get("global", "retries") == "7"
    assert not (env.prefix / "dmlpatch-pin").exists()
    assert env.digests() == env.outside


def test_a_symlinked_site_file_stays_a_link(env: Env) -> None:
    """A pip.conf kept elsewhere (a dotfiles repository) and linked into the venv: pin edits
    the file it links to, and unpin gives that file back; the link stays a link."""
    _installed(env)
    kept = env.prefix.parent / "dotfiles" / "pip.conf"
    kept.parent.mkdir()
    original = b"[global]\ntimeout = 20\n"
    kept.write_bytes(original)
    env.site_file.symlink_to(kept)
    assert env.dmlpatch("pin").code == 0
    assert env.site_file.is_symlink() and os.readlink(env.site_file) == str(kept)
    assert PINNED in env.pip("needs-new-torch").out
    assert env.dmlpatch("unpin").code == 0
    assert env.site_file.is_symlink() and kept.read_bytes() == original


def test_the_pins_files_are_written_0755_and_0644_whatever_the_umask(env: Env) -> None:
    """pip of every user of the environment reads them; nobody else may write them."""
    _installed(env)
    completed = subprocess.run(
        [env.python, "-m", "dmlpatch", "pin"],
        env=env.env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(0o002),
    )
    assert completed.returncode == 0, completed.stderr
    directory = env.prefix / "dmlpatch-pin"
    modes = {p.name: p.stat().st_mode & 0o777 for p in [directory, *directory.iterdir()]}
    assert modes == {"dmlpatch-pin": 0o755, "constraints.txt": 0o644, "state.json": 0o644}
    assert (env.purelib / "dmlpatch-pin.pth").stat().st_mode & 0o777 == 0o644


def test_a_pin_file_another_user_wrote_is_not_acted_on(env: Env) -> None:
    """unpin writes what state.json says into the site file: only from a file of this user's."""
    assert os.geteuid() == 0, "another user's file needs root"
    _installed(env)
    assert env.dmlpatch("pin").code == 0
    state = env.prefix / "dmlpatch-pin" / "state.json"
    os.chown(state, 1002, 1002)
    refused = env.dmlpatch("unpin")
    assert refused.code == 2
    assert refused.err_lines == [
        f"dmlpatch: error: {state} belongs to uid 1002, not to you (uid 0): dmlpatch does not act "
        f"on it; remove {state.parent} and dmlpatch's constraint line from {env.site_file} by hand"
    ]
    assert PINNED in env.pip("needs-new-torch").out  # nothing was changed


def test_after_dmlpatch_is_uninstalled_the_pin_is_silent_and_still_holds(env: Env) -> None:
    """An editable install uninstalled (its sources stay, dmlpatch cannot be imported): pip's
    processes print nothing of dmlpatch's, and the constraint, which keeps torch-directml
    working, still holds; the site file and the constraints say how to lift it by hand."""
    _installed(env)
    assert env.dmlpatch("pin").code == 0
    (env.purelib / "_dmlpatch_sources.pth").unlink()
    version = env.run("-m", "pip", "--version")
    assert version.code == 0 and version.err == "", version.err
    assert env.run("-c", "print('up')").err == ""
    refused = env.pip("needs-new-torch")
    assert refused.code == 1 and PINNED in refused.out
    assert "Error processing line" not in refused.err and _said(refused) == []
    site = env.site_file.read_text()
    assert pip_config.NOTE + "\n" in site
    assert "without dmlpatch: delete this line and the constraint below" in pip_config.NOTE
    constraints = (env.prefix / "dmlpatch-pin" / "constraints.txt").read_text()
    assert f"Without\n# dmlpatch: delete the constraint line it added to {env.site_file}." in (
        constraints
    )


def test_activate_pin_is_undone_by_deactivate_an_explicit_pin_is_not(env: Env) -> None:
    _installed(env)
    activated = env.dmlpatch("activate", "--device", "cpu", "--pin")
    assert activated.code == 0, activated.err
    assert "dmlpatch: pinned torch==2.4.1" in activated.err
    assert PINNED in env.pip("needs-new-torch").out
    deactivated = env.dmlpatch("deactivate")
    assert deactivated.code == 0
    assert deactivated.err_lines[1] == (
        f"dmlpatch: unpinned: removed {env.site_file} (dmlpatch pin had created it); "
        "pip may replace torch again"
    )
    assert not env.site_file.exists() and not (env.prefix / "dmlpatch-pin").exists()

    assert env.dmlpatch("pin").code == 0
    assert env.dmlpatch("activate", "--pin").code == 0
    kept = env.dmlpatch("deactivate")
    assert kept.err_lines[-1] == (
        "dmlpatch: pin protection stays (dmlpatch pin made it); dmlpatch unpin lifts it"
    )
    assert PINNED in env.pip("needs-new-torch").out
    assert env.dmlpatch("unpin").code == 0
    assert not env.site_file.exists()
    assert env.digests() == env.outside


def test_what_bypasses_the_pin_is_named_by_status(env: Env) -> None:
    """pip takes $PIP_CONSTRAINT instead of the site file's value, and reads no file at all
    with PIP_CONFIG_FILE=/dev/null: status says so rather than claim a pin pip ignores."""
    _installed(env)
    assert env.dmlpatch("pin").code == 0
    other = env.prefix.parent / "other.txt"
    other.write_text("capped<2\n")
    status = env.dmlpatch("status", PIP_CONSTRAINT=str(other))
    assert (
        "pin: warning: PIP_CONSTRAINT is set: pip takes its constraints instead of the pin's "
        f"(fix: add {env.prefix / 'dmlpatch-pin' / 'constraints.txt'} to PIP_CONSTRAINT, or "
        "unset it)"
    ) in status.out.splitlines()
    quiet = env.dmlpatch("status", PIP_CONFIG_FILE=os.devnull)
    assert f"pin: warning: PIP_CONFIG_FILE={os.devnull}: pip reads no configuration file" in (
        quiet.out
    )
    bypassed = env.pip("needs-new-torch", PIP_CONSTRAINT=str(other))
    assert bypassed.code == 0, bypassed.out + bypassed.err
    assert env.version("torch") == "2.5.0"
    assert env.dmlpatch("unpin").code == 0
    assert env.digests() == env.outside


def test_a_site_file_pip_cannot_read_is_one_line_and_left_alone(env: Env) -> None:
    _installed(env)
    env.site_file.write_bytes(b"[install\nconstraint = x\n")
    before = env.listing()
    result = env.dmlpatch("pin")
    assert result.code == 2
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith(
        f"dmlpatch: error: {env.site_file} is not a valid pip configuration file ("
    )
    assert env.site_file.read_bytes() == b"[install\nconstraint = x\n"
    assert env.listing() == before


def test_a_read_only_environment_is_one_line(env: Env) -> None:
    _installed(env)
    before = env.listing()
    completed = subprocess.run(
        [*NOBODY, env.python, "-m", "dmlpatch", "pin"],
        capture_output=True,
        text=True,
        env={**env.env, "HOME": "/tmp"},
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.splitlines() == [
        f"dmlpatch: error: cannot write to {env.prefix / 'dmlpatch-pin'}: Permission denied; "
        f"dmlpatch pin writes only in this environment ({env.prefix}), which must be writable"
    ]
    assert env.listing() == before


# -- the site file's edits, without pip ---------------------------------------------------------

SHAPES = {
    "no file": None,
    "empty": b"",
    "other sections": b"[global]\ntimeout = 5",
    "install without constraint": b"[install]\nno-compile = yes\n",
    "multi-line constraint": (
        b"[install]\nconstraint = a.txt\n    b.txt\n\n# c\n  c.txt\n[global]\nx = 1\n"
    ),
    "global constraint": b"[global]\nconstraint = g.txt\n",
    "crlf": b"[install]\r\nconstraint = a.txt\r\n[global]\r\nx = 1\r\n",
    "colon and case": b"[install]\nConstraint: a.txt\n",
    "default section": b"[DEFAULT]\nconstraint = d.txt\n[install]\nno-compile = yes\n",
    "empty key": b"[install]\nconstraint =\n",
}


@pytest.mark.parametrize("content", SHAPES.values(), ids=SHAPES.keys())
def test_added_then_taken_out_is_the_file_again(content: Optional[bytes]) -> None:
    ours = "file:///venv/dmlpatch-pin/constraints.txt"
    before = pip_config.install_constraints([("site", content)] if content is not None else [])
    own = pip_config.has_install_key(content) and before
    inherited = None if own else before
    merged, written = pip_config.with_constraint(content, "site", [ours], inherited)
    after = pip_config.constraints(pip_config.parse(merged, "site"), "install")
    assert after is not None and sorted(after) == sorted([ours, *(before or [])])
    if content:
        lines = content.splitlines()
        assert [line for line in merged.splitlines() if line in lines] == lines
    created_key = not pip_config.has_install_key(content)
    created = not pip_config.has_install_section(content)
    back = content or b""
    back += b"" if not back or back.endswith(b"\n") else b"\n"  # the one byte not given back
    assert pip_config.without_tokens(merged, "site", written, created_key, created) == back


def test_every_command_answers_help() -> None:
    for command in cli.COMMANDS:
        result = run_python(["-m", "dmlpatch", command, "--help"])
        assert result.code == 0, (command, result.err)
        assert result.out.startswith(f"usage: dmlpatch {command}"), command
        assert result.err == ""


@pytest.mark.parametrize(
    ("constraint", "pin", "holds"),
    [
        ("torch==2.4.1", "torch==2.4.1", True),
        # pip merges every constraint on a name: a machine-wide cap joins the pin
        ("torch<=2.14.1,==2.4.1", "torch==2.4.1", True),
        ("torchvision<=0.29.1,==0.19.1", "torchvision==0.19.1", True),
        ("torchvision==0.19.1", "torch==2.4.1", False),
        ("torch==2.4.10", "torch==2.4.1", False),
        ("capped<2", "torch==2.4.1", False),
    ],
)
def test_the_refusal_line_knows_the_pin_in_merged_constraints(
    constraint: str, pin: str, holds: bool
) -> None:
    from dmlpatch.pinning.pip_refusal import _holds

    assert _holds(constraint, pin) is holds
