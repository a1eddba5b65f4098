"""The bytecode cache of rewritten modules: tagged ``.pyc`` files beside the normal ones.

A rewritten module is cached in the ``__pycache__`` directory CPython would use (honouring
``sys.pycache_prefix``) under its own optimization tag, e.g.
``retinaface.cpython-311.opt-dmlpatch010h3f9a0c1d.pyc``. The tag carries dmlpatch's version and
a hash of everything else the rewritten code depends on (the spec's fingerprint, its expected
site count, the interpreter's ``-O`` level), so neither CPython nor another dmlpatch version
ever reads it. The model is pytest's assertion rewriter:

- a file is valid for one source ``(mtime_ns, size)`` and is rebuilt when either changes;
- writes go to a temporary file in the same directory, then ``os.replace``: a reader sees the
  old file or the new one, never half of one, even with concurrent processes;
- anything unreadable, truncated or from another format is a miss, and is rebuilt;
- an unwritable location (read-only tree, ``sys.pycache_prefix`` under a file) or
  ``sys.dont_write_bytecode`` only means the module is rewritten again next time.

Layout: ``MAGIC_NUMBER`` (4 bytes) | ``b"dml1"`` | source ``mtime_ns`` (8) | source size (8) |
``marshal.dumps((sites, code))`` with ``sites`` as ``(line, col, kind, text)`` tuples, so a warm
import knows what was rewritten without parsing.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import re
import sys
import types
from importlib.util import MAGIC_NUMBER, cache_from_source
from typing import Optional

from dmlpatch._version import __version__
from dmlpatch.rewriting.hook import GENERATION
from dmlpatch.rewriting.sites import Site

_FORMAT = b"dml1"
_HEADER_SIZE = 24
_MASK = (1 << 64) - 1

#: ``(st_mtime_ns, st_size)`` of a source file.
Stamp = tuple[int, int]


def tag(fingerprint: str, expect_sites: int, runtime: str) -> str:
    """The optimization tag for one target; ``cache_from_source`` wants it alphanumeric.

    The runtime's module name is part of the key because rewritten code imports it by name: a
    cache written before that module moved would fail to import it.
    """
    parts = (__version__, GENERATION, fingerprint, expect_sites, runtime, sys.flags.optimize)
    key = "\0".join(str(part) for part in parts)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:8]
    return f"dmlpatch{re.sub(r'[^0-9A-Za-z]', '', __version__)}h{digest}"


def location(source_path: str, optimization: str) -> Optional[str]:
    """Where the cached file for ``source_path`` lives; None where caching is off."""
    try:
        return cache_from_source(source_path, optimization=optimization)
    except NotImplementedError:  # sys.implementation.cache_tag is None: no pycs at all
        return None


def stamp(source_path: str) -> Stamp:
    status = os.stat(source_path)
    return status.st_mtime_ns, status.st_size


def read(
    cache_path: str, source_path: str, source_stamp: Stamp
) -> Optional[tuple[types.CodeType, list[Site]]]:
    """The cached code and sites, or None when missing, stale, foreign or damaged."""
    try:
        with open(cache_path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if data[:8] != MAGIC_NUMBER + _FORMAT or data[8:_HEADER_SIZE] != _pack(source_stamp):
        return None
    try:
        sites, code = marshal.loads(data[_HEADER_SIZE:])
        entries = [Site(*entry) for entry in sites]
    except (EOFError, ValueError, TypeError):  # truncated or garbage marshal data
        return None
    # A tree moved together with its __pycache__ would report the old path in tracebacks.
    if not isinstance(code, types.CodeType) or code.co_filename != source_path:
        return None
    return code, entries


def write(cache_path: str, source_stamp: Stamp, code: types.CodeType, sites: list[Site]) -> bool:
    """Store atomically; False (and nothing left behind) when the location is not writable."""
    from dmlpatch import atomic

    payload = tuple((s.line, s.col, s.kind, s.text) for s in sites)
    data = MAGIC_NUMBER + _FORMAT + _pack(source_stamp) + marshal.dumps((payload, code))
    try:
        atomic.write(cache_path, data)
    except OSError:
        return False  # disk full, or on Windows a reader holding the old file: keep the old one
    return True


def _pack(source_stamp: Stamp) -> bytes:
    mtime_ns, size = source_stamp
    return (mtime_ns & _MASK).to_bytes(8, "little") + (size & _MASK).to_bytes(8, "little")
