"""Whether a cached rewrite or verdict still describes its source: python's own rule, per module.

Python trusts a module's ``.pyc`` while the source's modification time and size are those it
recorded, unless that ``.pyc`` is hash-based (PEP 552: ``py_compile``'s checked-hash mode, which
reproducible builds and ``SOURCE_DATE_EPOCH`` give) and checked, or
``--check-hash-based-pycs always`` asks for every hash-based one to be checked: then it compares
a hash of the source and ignores the time. An edit that keeps both size and time is noticed by
python there, so it must be by dmlpatch's caches too: each records the source's hash beside its
``(mtime_ns, size)``, and where python would check a hash for that source, a hit needs the hash
too (:func:`checks_hash`).
"""

from __future__ import annotations

import _imp
import os

_HASH_BASED = 0b01
_CHECK_SOURCE = 0b10


def source_hash(source: bytes) -> bytes:
    """The 8-byte hash python records in a hash-based ``.pyc`` for ``source``."""
    from importlib.util import source_hash as python_hash

    return python_hash(source)


def checks_hash(source_path: str) -> bool:
    """Whether python validates the bytecode of ``source_path`` by a hash of its source.

    Told from the flags of the ``.pyc`` python would read for it (16 bytes read). Without one
    python compiles the source and writes a timestamp-based file, so the answer is no.
    """
    mode = _imp.check_hash_based_pycs
    if mode == "never":
        return False
    from importlib.util import MAGIC_NUMBER, cache_from_source

    try:
        pyc = cache_from_source(source_path)
    except (NotImplementedError, ValueError):
        return False
    try:
        descriptor = os.open(pyc, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return False
    try:
        header = os.read(descriptor, 8)
    except OSError:
        return False
    finally:
        os.close(descriptor)
    if len(header) < 8 or header[:4] != MAGIC_NUMBER:
        return False
    flags = int.from_bytes(header[4:8], "little")
    return bool(flags & _HASH_BASED) and (bool(flags & _CHECK_SOURCE) or mode == "always")
