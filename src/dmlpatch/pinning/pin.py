"""``dmlpatch pin``: every later ``pip install`` in this environment keeps torch-directml's torch.

torch-directml's native library is built against one exact torch (0.2.5: ``torch==2.4.1``,
``torchvision==0.19.1``); any other torch makes ``import torch_directml`` fail with "undefined
symbol". pip knows nothing of it and replaces torch as soon as a library asks for another one.

The pin is a constraints file holding torch-directml's own ``Requires-Dist`` (read from its
installed metadata; torch_directml is never imported), named under ``[install] constraint`` in
the environment's own pip configuration file, ``sys.prefix/pip.conf`` (``pip.ini`` on
Windows), which pip reads as its *site* file. pip then refuses an install that would move torch,
in its own words::

    ERROR: Cannot install some-library==1.0 because these package versions have conflicting
    dependencies.
    The conflict is caused by:
        some-library 1.0 depends on torch>=2.5
        The user requested (constraint) torch==2.4.1

pip shows a constraint's name and versions, never its file's comments or path, and no pip
setting prints a message of ours. So the pin also writes ``dmlpatch-pin.pth`` into
site-packages: in pip's processes only, it listens to the logger pip reports conflicts on and,
when the conflict names a pinned requirement, adds one line after pip's (see
``dmlpatch.pinning.pip_refusal``); pip itself is not wrapped. ``dmlpatch status`` and
``dmlpatch doctor`` say the same.

Besides that ``.pth``, only the site file is written. One the user already has is edited in
place (see pip_config), through a symbolic link where it is one, and given back byte for byte by
``dmlpatch unpin``. A constraint the
global or user files gave ``pip install`` is carried into the new key, since pip reads one value
per key. What the pin keeps — the constraints, the site file as it was, what was added — lives
in ``sys.prefix/dmlpatch-pin/`` (0755, its files 0644, whatever the umask: pip of every user
of the environment reads the constraints). ``unpin`` writes what those files say only when they
are this user's (or root's) and writable by nobody else (``dmlpatch.trust``), and only to this
environment's site file. A pin made by ``dmlpatch activate --pin`` is lifted by
``dmlpatch deactivate`` too.

After ``pip uninstall dmlpatch`` the ``.pth`` line stays silent (it asks whether dmlpatch can
still be imported) and the constraint stays in force, which keeps torch-directml working; the
site file's comment and the constraints file's header say how to lift it by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, NamedTuple, Optional

from dmlpatch import _metadata, log, trust
from dmlpatch.errors import DmlpatchError
from dmlpatch.pinning import pip_config

DIRECTORY_NAME = "dmlpatch-pin"
PTH_NAME = "dmlpatch-pin.pth"
# Runs at the start of every Python process of the environment and imports something only in
# pip's (`pip ...` or `python -m pip ...`): a guarded stat, as activation's line.
_PTH_TARGET = "dmlpatch.pinning.pip_refusal:watch"
DISTRIBUTION = "torch-directml"
LIFT = "dmlpatch unpin"


def directory() -> Path:
    return Path(sys.prefix) / DIRECTORY_NAME


def constraints_file() -> Path:
    return directory() / "constraints.txt"


def constraints_url() -> str:
    """How the site file names the constraints: a ``file:`` URL has no space for pip to split."""
    return constraints_file().as_uri()


def pth_path() -> Path:
    """The ``.pth`` that has pip say, after refusing an install over the pin, that it is ours."""
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def _pth_text() -> str:
    from dmlpatch.startup import pth_line

    guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pip_refusal.py")
    return pth_line.line(guard, _PTH_TARGET, str(constraints_file()), only_pip=True)


class Pins(NamedTuple):
    version: str  # torch-directml's
    requirements: list[str]  # e.g. ["torch==2.4.1", "torchvision==0.19.1"]


def directml_pins() -> Optional[Pins]:
    """torch-directml's version requirements, from its metadata; None when it is not installed."""
    from packaging.requirements import InvalidRequirement, Requirement

    metadata = _metadata._metadata()
    try:
        distribution = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    found = []
    for line in distribution.requires or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        applies = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        if applies and requirement.specifier and requirement.url is None:
            found.append(f"{requirement.name}{requirement.specifier}")
    return Pins(distribution.version, found)


_RECORDED = {
    *("origin", "site_file", "existed", "mode", "written", "inherited"),
    *("created_section", "created_key", "sha256", "pins", "torch_directml"),
}


def state() -> Optional[dict[str, Any]]:
    """What ``pin`` recorded, or None when this environment is not pinned (to show, not to act
    on: see :func:`_trusted_state`)."""
    try:
        data = json.loads((directory() / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and set(data) >= _RECORDED else None


def _trusted_state() -> Optional[dict[str, Any]]:
    """:func:`state`, from a file only this user (or root) could have written, naming this
    environment's site file: what ``pin`` and ``unpin`` act on. Raises DmlpatchError otherwise."""
    content = _read_own(directory() / "state.json")
    try:
        data = json.loads(content) if content is not None else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not set(data) >= _RECORDED:
        return None
    if data["site_file"] != str(pip_config.site_file()):
        raise DmlpatchError(
            f"{directory() / 'state.json'} names {data['site_file']!r}, not this environment's "
            f"pip configuration file {pip_config.site_file()}; remove {directory()} and "
            "dmlpatch's constraint line from that file by hand"
        )
    return data


def _read_own(path: Path) -> Optional[bytes]:
    """One of the pin's own files: None when absent; DmlpatchError when someone other than
    this user or root could have written it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise DmlpatchError(f"cannot read {path}: {error.strerror}") from None
    with open(descriptor, "rb") as stream:
        problem = trust.file_problem(os.fstat(descriptor))
        if problem is not None:
            raise DmlpatchError(
                f"{path} {problem}: dmlpatch does not act on it; remove {directory()} and "
                f"dmlpatch's constraint line from {pip_config.site_file()} by hand"
            )
        return stream.read()


# -- pin and unpin ------------------------------------------------------------------------------


class Outcome(NamedTuple):
    changed: bool
    message: str  # one line for the user (without the "dmlpatch: " prefix)


def pin(origin: str = "pin") -> Outcome:
    """Write (or refresh) the pin; ``origin`` is ``pin`` or ``activate`` (what lifts it)."""
    pins = directml_pins()
    if pins is None:
        return Outcome(
            False,
            f"{DISTRIBUTION} is not installed in this environment ({sys.prefix}); nothing to pin",
        )
    if not pins.requirements:
        return Outcome(
            False, f"{DISTRIBUTION} {pins.version} declares no version requirements; nothing to pin"
        )
    site = pip_config.site_file()
    previous = _trusted_state()
    original, _ = _without_pin(previous, site)
    content = _constraints_text(pins)
    outer = pip_config.outer_files()
    inherited = pip_config.install_constraints(
        [*(outer or []), *([(str(site), original)] if original is not None else [])]
    )
    merged, written = pip_config.with_constraint(
        original, str(site), [constraints_url()], inherited
    )
    if previous is not None and previous.get("origin") == "pin":
        origin = "pin"  # an explicit pin outlives activate --pin / deactivate
    record = {
        "origin": origin,
        "site_file": str(site),
        "existed": original is not None,
        "mode": previous.get("mode") if previous else _mode(site),
        "written": written,  # constraints_url() and what the new key carried
        "inherited": inherited,
        "created_section": not pip_config.has_install_section(original),
        "created_key": not pip_config.has_install_key(original),
        "sha256": hashlib.sha256(merged).hexdigest(),
        "pins": pins.requirements,
        "torch_directml": pins.version,
    }
    listed = ", ".join(pins.requirements)
    unchanged = (
        previous == record
        and _read(constraints_file()) == content.encode()
        and _read(site) == merged
        and _read(pth_path()) == _pth_text().encode()
    )
    if unchanged:
        return Outcome(False, f"already pinned: {listed} ({site}); undo with: {LIFT}")
    _make_directory()
    _write(directory() / "state.json", json.dumps(record, indent=2).encode())
    _write(constraints_file(), content.encode())
    if original is not None:
        _write(directory() / "site-file-before-pin", original)
    else:
        (directory() / "site-file-before-pin").unlink(missing_ok=True)
    _write(site, merged, _mode(site))  # after the constraints: pip never sees a missing file
    _write(pth_path(), _pth_text().encode())
    return Outcome(
        True,
        f"pinned {listed} ({DISTRIBUTION} {pins.version}'s requirements) for every pip install "
        f"in this environment: {site} names {constraints_file()}; undo with: {LIFT}",
    )


def unpin(origin: Optional[str] = None) -> Optional[Outcome]:
    """Give the site file back as it was; None when not pinned (or pinned by another origin)."""
    recorded = _trusted_state()
    if recorded is None or (origin is not None and recorded.get("origin") != origin):
        return None
    site = pip_config.site_file()
    content, how = _without_pin(recorded, site)
    if how == RESTORED:
        _write(site, content or b"", recorded["mode"])
        said = f"restored {site} as it was before dmlpatch pin"
    elif how == STRIPPED and content is not None:
        _write(site, content, _mode(site))
        said = f"took dmlpatch's constraint out of {site}, keeping the changes made since the pin"
    elif how in (CREATED, STRIPPED):
        _remove(site)
        said = f"removed {site} (dmlpatch pin had created it)"
    else:
        said = f"{site} no longer named the pin"
    _remove(pth_path())
    _remove_tree(directory())
    return Outcome(True, f"unpinned: {said}; pip may replace torch again")


# -- what status and doctor say -----------------------------------------------------------------


def describe() -> dict[str, Any]:
    """The pin as data, for ``status --json`` and ``doctor --json``."""
    recorded = state()
    pins = directml_pins()
    return {
        "pinned": recorded is not None,
        "pins": recorded.get("pins") if recorded else None,
        "origin": recorded.get("origin") if recorded else None,
        "site_file": str(pip_config.site_file()),
        "constraints": str(constraints_file()) if recorded else None,
        "torch_directml": pins.version if pins else None,
        "torch_directml_requires": pins.requirements if pins else None,
        "problems": [problem for problem, _ in problems()],
    }


def summary() -> str:
    """One line: is pip held to torch-directml's torch here, and what pip's refusal means."""
    recorded = state()
    if recorded is None:
        pins = directml_pins()
        if pins is None:
            return f"pin: off ({DISTRIBUTION} not installed)"
        return (
            f"pin: off: a pip install may replace {', '.join(pins.requirements)}, which "
            f"{DISTRIBUTION} {pins.version} needs (dmlpatch pin keeps them)"
        )
    first = recorded["pins"][0]
    return (
        f"pin: {', '.join(recorded['pins'])} for every pip install here "
        f"({recorded['site_file']}); pip refuses a library that needs another torch with "
        f"'The user requested (constraint) {first}': that is this pin ({LIFT} lifts it)"
    )


def problems(check_outer: bool = False) -> list[tuple[str, Optional[str]]]:
    """Why pip may not hold to the pin right now, each with the command that fixes it.

    ``check_outer`` also asks pip for its global and user files (about 0.3 s) to see whether a
    constraint they give changed since it was carried into the site file.
    """
    recorded = state()
    if recorded is None:
        return []
    found: list[tuple[str, Optional[str]]] = []
    repin = "dmlpatch pin"
    if os.environ.get("PIP_CONFIG_FILE") == os.devnull:
        found.append((f"PIP_CONFIG_FILE={os.devnull}: pip reads no configuration file", None))
    given = os.environ.get("PIP_CONSTRAINT", "").split()
    if given and not any(pip_config.same_file(t, constraints_file()) for t in given):
        found.append(
            (
                "PIP_CONSTRAINT is set: pip takes its constraints instead of the pin's",
                f"add {constraints_file()} to PIP_CONSTRAINT, or unset it",
            )
        )
    site = Path(recorded["site_file"])
    current = _read(site)
    if current is None or not _names_pin(current, str(site)):
        found.append((f"{site} no longer names {constraints_file()}", repin))
    if not constraints_file().is_file():
        found.append((f"{constraints_file()} is missing", repin))
    pins = directml_pins()
    if pins is None:
        found.append((f"{DISTRIBUTION} is no longer installed", LIFT))
    elif pins.requirements != recorded.get("pins"):
        found.append(
            (
                f"{DISTRIBUTION} {pins.version} requires {', '.join(pins.requirements)}, the pin "
                f"still says {', '.join(recorded.get('pins') or [])}",
                repin,
            )
        )
    if check_outer and recorded.get("created_key"):
        outer = pip_config.outer_files()
        before = _read(directory() / "site-file-before-pin") if recorded.get("existed") else None
        files = [*(outer or []), *([(str(site), before)] if before is not None else [])]
        if outer is not None and pip_config.install_constraints(files) != recorded.get("inherited"):
            found.append(
                ("the constraint your global or user pip configuration gives has changed", repin)
            )
    return found


def check() -> tuple[str, str, Optional[str], dict[str, Any]]:
    """``doctor``'s pin check: status (OK/WARN), message, fix, details."""
    details = describe()
    found = problems(check_outer=True)
    details["problems"] = [problem for problem, _ in found]
    if found:
        fix = next((f for _, f in found if f), None)
        return "WARN", "pin not in force: " + "; ".join(p for p, _ in found), fix, details
    if details["pinned"]:
        return "OK", summary().removeprefix("pin: "), None, details
    if details["torch_directml"] is None:
        return "OK", f"{DISTRIBUTION} not installed: nothing to pin", None, details
    return "WARN", summary().removeprefix("pin: "), "dmlpatch pin", details


def warnings_after_pin() -> list[str]:
    """What to tell the user right after pinning: installed versions off the pin, overrides."""
    said = [problem for problem, _ in problems()]
    pins = directml_pins()
    if pins is None:
        return said
    from packaging.requirements import Requirement

    for text in pins.requirements:
        requirement = Requirement(text)
        installed = _metadata.version_of(requirement.name)
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            said.append(
                f"{requirement.name} {installed or 'is not installed'}, not {text}: "
                f"pip install {' '.join(pins.requirements)} puts back what {DISTRIBUTION} needs"
            )
    return said


# -- the commands -------------------------------------------------------------------------------


def say_pin(origin: str) -> None:
    """Pin, and say what happened and what pip will show (shared with ``activate --pin``)."""
    outcome = pin(origin)
    log.say(outcome.message)
    recorded = state()
    if recorded is None:
        return
    if outcome.changed:
        log.say(
            "pip now refuses a library that needs another torch with 'The user requested "
            f"(constraint) {recorded['pins'][0]}', then a line of dmlpatch's saying why"
        )
    for warning in warnings_after_pin():
        log.say(f"warning: {warning}")


# -- files --------------------------------------------------------------------------------------


def _constraints_text(pins: Pins) -> str:
    return (
        f"# Written by `dmlpatch pin` from {DISTRIBUTION} {pins.version}'s requirements: its\n"
        "# native library is built against exactly this torch; another one makes\n"
        "# `import torch_directml` fail with 'undefined symbol'. Every pip install in this\n"
        "# environment keeps them. A library that needs another torch fails to install with\n"
        f"# pip's 'The user requested (constraint) {pins.requirements[0]}': install a release of\n"
        f"# it that works with {pins.requirements[0]}, or lift the pin with `{LIFT}`. Without\n"
        f"# dmlpatch: delete the constraint line it added to {pip_config.site_file()}.\n"
        + "".join(f"{requirement}\n" for requirement in pins.requirements)
    )


RESTORED, CREATED, STRIPPED, UNPINNED = "restored", "created", "stripped", "unpinned"


def _without_pin(
    recorded: Optional[dict[str, Any]], site: Path
) -> tuple[Optional[bytes], Optional[str]]:
    """The site file as it would be without the pin (None: no file), and how that was found.

    Unchanged since the pin: the copy kept (``RESTORED``) or no file (``CREATED``). Changed
    since, but still naming the pin: the pin taken out of it (``STRIPPED``). Otherwise as it is.
    """
    current = _read(site)
    if recorded is None:
        return current, None
    as_pinned = current is not None and hashlib.sha256(current).hexdigest() == recorded["sha256"]
    before = _read_own(directory() / "site-file-before-pin") if recorded["existed"] else None
    if as_pinned and not recorded["existed"]:
        return None, CREATED
    if as_pinned and before is not None:
        return before, RESTORED
    if current is not None and _names_pin(current, str(site)):
        stripped = pip_config.without_tokens(
            current,
            str(site),
            recorded["written"],
            recorded["created_key"],
            recorded["created_section"],
        )
        return (stripped if stripped.strip() or recorded["existed"] else None), STRIPPED
    return current, UNPINNED


def _names_pin(content: bytes, name: str) -> bool:
    try:
        listed = pip_config.constraints(pip_config.parse(content, name), "install") or []
    except DmlpatchError:
        return False
    return any(pip_config.same_file(token, constraints_file()) for token in listed)


def _read(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _mode(path: Path) -> Optional[int]:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return None


def _make_directory() -> None:
    """``dmlpatch-pin/``, 0755 whatever the umask; one that another user could write to is
    not written into."""
    path = directory()
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        problem = trust.entry_problem(str(path))
        if problem is not None:
            raise DmlpatchError(
                f"{problem}: dmlpatch pin does not write there; remove it, or fix its owner "
                "and mode"
            ) from None
        return
    except OSError as error:
        raise DmlpatchError(
            f"cannot write to {path}: {error.strerror}; dmlpatch pin writes only in this "
            f"environment ({sys.prefix}), which must be writable"
        ) from None
    path.chmod(0o755)


def _write(path: Path, content: bytes, mode: Optional[int] = None) -> None:
    """Atomically (a crash leaves the old file whole, never a torn one), with ``mode`` or 644.

    A symbolic link (a pip.conf kept in a dotfiles repository) stays one: its target is written.
    """
    from dmlpatch import atomic

    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        atomic.write(path, content, mode=0o644 if mode is None else mode, durable=True)
    except OSError as error:
        raise DmlpatchError(
            f"cannot write to {path.parent}: {error.strerror}; dmlpatch pin writes only in this "
            f"environment ({sys.prefix}), which must be writable"
        ) from None


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as error:
        raise DmlpatchError(f"cannot remove {path}: {error.strerror}") from None


def _remove_tree(root: Path) -> None:
    for name in ("constraints.txt", "site-file-before-pin", "state.json"):
        _remove(root / name)
    with contextlib.suppress(OSError):  # something of the user's is in there: leave it
        root.rmdir()
