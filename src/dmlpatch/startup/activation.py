"""``dmlpatch activate``: a ``.pth`` file that starts dmlpatch in every process of this environment.

The model is coverage.py's ``process_startup``: site.py executes ``import`` lines of ``.pth``
files at interpreter start. Ours imports nothing unless dmlpatch is still installed, stores the
device as a string literal (read back with ``ast.literal_eval``, never executed by us), and is
written atomically. No other file in site-packages is touched.
"""

from __future__ import annotations

import ast
import os
import re
import sysconfig
from pathlib import Path
from typing import Optional

from dmlpatch.devices import resolution
from dmlpatch.errors import DmlpatchError

PTH_NAME = "dmlpatch-activate.pth"
# Guarded by the path of dmlpatch's own bootstrap, so an uninstalled dmlpatch costs one stat()
# and no error; importlib.util.find_spec would cost every process ~3 ms more.
_LINE = (
    "import os; os.environ.get('DMLPATCH_DISABLE') != '1' and os.path.exists({guard!r}) and "
    "__import__('dmlpatch.startup.bootstrap').startup.bootstrap.startup({device!r})\n"
)
_DEVICE_IN_LINE = re.compile(r"startup\((?P<literal>'[^\n]*'|\"[^\n]*\")\)\s*$")
_GUARD_IN_LINE = re.compile(r"os\.path\.exists\((?P<literal>'[^']*'|\"[^\"]*\")\)")


def site_packages() -> Path:
    """The current environment's pure-Python site-packages (a venv's own, when in one)."""
    return Path(sysconfig.get_paths()["purelib"])


def pth_path() -> Path:
    return site_packages() / PTH_NAME


def activate(device: str = "auto") -> tuple[Path, bool]:
    """Write (or rewrite) the ``.pth``; returns its path and whether anything changed."""
    resolution.parse(device)
    path = pth_path()
    guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")
    content = _LINE.format(device=device, guard=guard)
    if path.is_file() and path.read_text(encoding="utf-8") == content:
        return path, False
    _write_atomically(path, content)
    return path, True


def deactivate() -> Optional[Path]:
    """Remove the ``.pth``; returns its path, or None when there was none."""
    path = pth_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise DmlpatchError(f"cannot remove {path}: {error.strerror}") from None
    return path


def configured_device() -> Optional[str]:
    """The device the ``.pth`` starts processes with, or None when not activated."""
    try:
        line = pth_path().read_text(encoding="utf-8")
    except OSError:
        return None
    match = _DEVICE_IN_LINE.search(line)
    if match is None:
        return None
    value = ast.literal_eval(match.group("literal"))
    return value if isinstance(value, str) else None


def stale() -> Optional[str]:
    """Why the ``.pth`` starts nothing although present, or None.

    Its line starts dmlpatch only while the bootstrap file it names exists: after dmlpatch is
    upgraded to a layout where that file moved, or uninstalled, every process runs unpatched.
    """
    try:
        line = pth_path().read_text(encoding="utf-8")
    except OSError:
        return None
    match = _GUARD_IN_LINE.search(line)
    guard = ast.literal_eval(match.group("literal")) if match else None
    if not isinstance(guard, str):
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
