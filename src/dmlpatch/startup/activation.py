"""``dmlpatch activate``: a ``.pth`` file that starts dmlpatch in every process of this environment.

The model is coverage.py's ``process_startup``: site.py executes ``import`` lines of ``.pth``
files at interpreter start. Ours (``dmlpatch.startup.pth_line``) imports nothing unless dmlpatch
is still installed and says nothing once it is gone, stores the device as a string literal (read
back with ``ast.literal_eval``, never executed by us), and is written atomically. Other lines in
the file (a user's, another tool's) are kept by ``activate`` and ``deactivate``. No other file in
site-packages is touched.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Optional

from dmlpatch.devices import resolution
from dmlpatch.errors import DmlpatchError
from dmlpatch.startup import pth_line

PTH_NAME = "dmlpatch-activate.pth"
TARGET = "dmlpatch.startup.bootstrap:startup"


def line(device: str) -> str:
    """The start-up line for ``device``, guarded by the path of dmlpatch's own bootstrap, so an
    uninstalled dmlpatch costs one stat() (importlib.util.find_spec would cost ~3 ms)."""
    guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")
    return pth_line.line(guard, TARGET, device)


def site_packages() -> Path:
    """The current environment's pure-Python site-packages (a venv's own, when in one)."""
    return Path(sysconfig.get_paths()["purelib"])


def pth_path() -> Path:
    return site_packages() / PTH_NAME


def _read() -> tuple[Optional[str], list[str]]:
    """Our line in the ``.pth`` (None: not there) and the file's other lines."""
    try:
        content = pth_path().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None, []
    return pth_line.split(content, TARGET)


def activate(device: str = "auto") -> tuple[Path, bool]:
    """Write (or rewrite) our line in the ``.pth``; returns its path and whether anything
    changed. The file's other lines stay."""
    resolution.parse(device)
    path = pth_path()
    ours, others = _read()
    if others and not others[-1].endswith("\n"):
        others[-1] += "\n"
    content = "".join([*others, line(device)])
    if ours is not None and path.read_text(encoding="utf-8") == content:
        return path, False
    _write_atomically(path, content)
    return path, True


def deactivate() -> Optional[str]:
    """Take our line out of the ``.pth`` (the file goes with it when nothing else is in it);
    returns what was done, in words, or None when there was no line of ours."""
    path = pth_path()
    ours, others = _read()
    if ours is None:
        return None
    if any(text.strip() for text in others):
        _write_atomically(path, "".join(others))
        return f"took dmlpatch's line out of {path} (its other lines stay)"
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise DmlpatchError(f"cannot remove {path}: {error.strerror}") from None
    return f"removed {path}"


def absence() -> str:
    """Why this environment is not activated, in a few words: the ``.pth`` is absent, or holds
    no line of dmlpatch's."""
    path = pth_path()
    return f"no line of dmlpatch's in {path}" if path.exists() else f"{path} absent"


def configured_device() -> Optional[str]:
    """The device the ``.pth`` starts processes with, or None when not activated."""
    ours, _ = _read()
    return pth_line.argument(ours) if ours is not None else None


def stale() -> Optional[str]:
    """Why the ``.pth`` starts nothing although present, or None.

    Its line starts dmlpatch only while the bootstrap file it names exists: after dmlpatch is
    upgraded to a layout where that file moved, or uninstalled, every process runs unpatched.
    """
    ours, others = _read()
    if ours is None:
        return "is not a line dmlpatch activate writes" if others else None
    guard = pth_line.guard(ours)
    if guard is None:
        return "is not a line dmlpatch activate writes"
    if os.path.exists(guard):
        return None
    return f"names {guard}, which does not exist (written by another dmlpatch installation)"


def _write_atomically(path: Path, content: str) -> None:
    from dmlpatch import atomic

    try:
        atomic.write(path, content.encode("utf-8"), mode=0o644, durable=True)
    except OSError as error:
        raise DmlpatchError(
            f"cannot write to {path.parent}: {error.strerror}; activate needs a writable "
            "environment (use a virtual environment, or python -m dmlpatch instead)"
        ) from None
