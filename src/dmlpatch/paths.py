"""Where dmlpatch keeps what it builds (simulated-device extension, caches).

Every cache lives in a subdirectory of :func:`cache_directory` that :func:`cache_subdirectory`
makes private and checks (``dmlpatch.trust``): one another user could write is not used.
"""

from __future__ import annotations

import os

from dmlpatch.environment_variables import DMLPATCH_CACHE_DIR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Optional

_subdirectories: dict[tuple[str, str], Optional[str]] = {}


def cache_directory() -> str:
    """``$DMLPATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/dmlpatch``, else ``~/.cache/dmlpatch``.

    Not created here: callers create what they need and fall back when they cannot. A plain
    string, because the start-up path avoids importing pathlib.
    """
    explicit = os.environ.get(DMLPATCH_CACHE_DIR)
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dmlpatch")


def cache_subdirectory(name: str, create: bool = True) -> Optional[str]:
    """``<cache>/<name>``, created private when missing and ``create``; None when it cannot be
    used. Without ``create`` a missing directory is still named (reading from it misses), so a
    process that only reads its caches writes nothing.

    A cache that cannot be created (a read-only disk, ``DMLPATCH_CACHE_DIR`` naming a file) is
    simply not used. One whose path another user could write to is not used either, and one
    warning per process says why and what to do. Answers are kept for the process.
    """
    root = cache_directory()
    path = os.path.join(root, name)
    key = (root, name)
    if key in _subdirectories:
        return _subdirectories[key]
    if not create and not os.path.isdir(path):
        return path
    from dmlpatch import trust

    try:
        problem = trust.make_directory(path)
    except OSError:
        if not os.path.isdir(path):
            _subdirectories[key] = None
            return None
        problem = trust.directory_problem(path)  # a read-only one may still be read
    if problem is not None:
        from dmlpatch import log

        log.warn_once(
            f"cache:{root}",
            f"cache directory {root} is not used: {problem}; set {DMLPATCH_CACHE_DIR} to a "
            "directory of yours that only you can write",
        )
        _subdirectories[key] = None
        return None
    _subdirectories[key] = path
    return path


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
