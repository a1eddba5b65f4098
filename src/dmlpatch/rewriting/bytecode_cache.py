"""The bytecode cache of rewritten modules: tagged ``.pyc`` files beside the normal ones.

A rewritten module is cached in the ``__pycache__`` directory CPython would use (honouring
``sys.pycache_prefix``) under its own optimization tag, e.g.
``retinaface.cpython-311.opt-dmlpatch010h3f9a0c1d.pyc``. The tag carries dmlpatch's version and
a hash of everything else the rewritten code depends on (the spec's fingerprint, its expected
site count, the interpreter's ``-O`` level), so neither CPython nor another dmlpatch version
ever reads it. The model is pytest's assertion rewriter:

- a file is valid for one source ``(mtime_ns, size)`` and is rebuilt when either changes, or,
  where python checks this source's bytecode by hash, for one source hash
  (``dmlpatch.rewriting.freshness``);
- writes go to a temporary file in the same directory, then ``os.replace``: a reader sees the
  old file or the new one, never half of one, even with concurrent processes;
- anything unreadable, truncated or from another format is a miss, and is rebuilt;
- so is a file another user could have written (``dmlpatch.trust``): it must belong to this
  user, root or the source's owner, and be writable by nobody else. It is written readable by
  whoever can read the source (as python's own) and writable by its owner only, whatever the
  umask. ``__pycache__`` is python's directory: made as python makes it, its files checked one by
  one on the open descriptor;
- an unwritable location (read-only tree, ``sys.pycache_prefix`` under a file) or
  ``sys.dont_write_bytecode`` only means the module is rewritten again next time.

Layout: ``MAGIC_NUMBER`` (4 bytes) | ``b"dml2"`` | source ``mtime_ns`` (8) | source size (8) |
source hash (8) | ``marshal.dumps((sites, code))`` with ``sites`` as ``(line, col, kind, text)``
tuples, so a warm import knows what was rewritten without parsing.
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
from dmlpatch.rewriting.rules import GENERATION
from dmlpatch.rewriting.transform import Site

_FORMAT = b"dml2"
_HEADER_SIZE = 32
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
    cache_path: str,
    source_path: str,
    source_stamp: Stamp,
    source_hash: Optional[bytes] = None,
    source_owner: Optional[int] = None,
) -> Optional[tuple[types.CodeType, list[Site]]]:
    """The cached code and sites, or None when missing, stale, foreign, damaged or untrusted.

    ``source_hash`` given: valid for that source hash whatever the stamp (python's checked
    hash-based pycs); else for ``source_stamp``.
    """
    from dmlpatch import trust

    data = trust.read(cache_path, also=source_owner)
    if data is None or data[:8] != MAGIC_NUMBER + _FORMAT or len(data) < _HEADER_SIZE:
        return None
    if source_hash is not None:
        if data[24:_HEADER_SIZE] != source_hash:
            return None
    elif data[8:24] != _pack(source_stamp):
        return None
    try:
        sites, code = marshal.loads(data[_HEADER_SIZE:])
        entries = [_site(entry) for entry in sites]
    except (EOFError, ValueError, TypeError):  # truncated or garbage marshal data
        return None
    # A tree moved together with its __pycache__ would report the old path in tracebacks.
    if not isinstance(code, types.CodeType) or code.co_filename != source_path:
        return None
    return code, entries


def _site(entry: object) -> Site:
    """A stored site, or TypeError when it is not one."""
    if (
        not isinstance(entry, tuple)
        or len(entry) != 4
        or type(entry[0]) is not int
        or type(entry[1]) is not int
        or not isinstance(entry[2], str)
        or not isinstance(entry[3], str)
    ):
        raise TypeError("not a stored site")
    return Site(*entry)


def write(
    cache_path: str,
    source_stamp: Stamp,
    source_hash: bytes,
    code: types.CodeType,
    sites: list[Site],
    source_mode: int = 0o600,
) -> bool:
    """Store atomically; False (and nothing left behind) when the location is not writable.

    Readable by whoever can read the source (``source_mode``), writable by its owner only.
    """
    from dmlpatch import atomic

    payload = tuple((s.line, s.col, s.kind, s.text) for s in sites)
    header = MAGIC_NUMBER + _FORMAT + _pack(source_stamp) + source_hash[:8].ljust(8, b"\0")
    data = header + marshal.dumps((payload, code))
    try:
        atomic.write(cache_path, data, mode=(source_mode & 0o644) | 0o600)
    except OSError:
        return False  # disk full, or on Windows a reader holding the old file: keep the old one
    return True


def _pack(source_stamp: Stamp) -> bytes:
    mtime_ns, size = source_stamp
    return (mtime_ns & _MASK).to_bytes(8, "little") + (size & _MASK).to_bytes(8, "little")
