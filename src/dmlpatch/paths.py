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


def file_tag(text: str) -> str:
    """Eight hex digits (32-bit FNV-1a) naming a cache file after ``text``, the same in every
    process; zlib's crc32 would load a shared library into every process at start-up."""
    value = 0x811C9DC5
    for byte in text.encode("utf-8", "surrogateescape"):
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{value:08x}"
