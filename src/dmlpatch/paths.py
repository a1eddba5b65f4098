"""Where dmlpatch keeps what it builds (simulated-device extension, caches)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$DMLPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/dmlpatch``, else ``~/.cache/dmlpatch``.

    Not created here: callers create what they need and fall back when they cannot.
    """
    explicit = os.environ.get("DMLPATCH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "dmlpatch"
