"""Where dmlpatch keeps what it builds (simulated-device extension, caches)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


def cache_directory() -> str:
    """``$DMLPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/dmlpatch``, else ``~/.cache/dmlpatch``.

    Not created here: callers create what they need and fall back when they cannot. A plain
    string, because the start-up path avoids importing pathlib.
    """
    explicit = os.environ.get("DMLPATCH_CACHE_DIR")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dmlpatch")


def cache_root() -> Path:
    """:func:`cache_directory` as a ``Path``."""
    from pathlib import Path

    return Path(cache_directory())
