"""What dmlpatch did in this process, recorded as it happens: modules rewritten, functions
wrapped, modules aliased, and what was left alone and why.

The import hook, discovery and the specs engine write here; ``dmlpatch.report`` reads it when
it assembles the report. This module imports nothing of dmlpatch's, so anything may write to it
without importing the report's readers (the device session, discovery's scope).
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

#: The pseudo-spec names of what no patch spec named: the program's main script, and modules
#: rewritten (or left alone) by discovery.
MAIN = "__main__"
DISCOVERED = "discovered"

_lock = _thread.allocate_lock()
_rewrites: list[dict[str, Any]] = []
_wraps: list[dict[str, Any]] = []
_skipped: list[dict[str, Any]] = []
_aliases: list[dict[str, Any]] = []


def record_rewrite(spec: str, module: str, sites: int, cached: bool) -> None:
    """A module was compiled with its CUDA sites rewritten (``cached``: from the bytecode cache)."""
    with _lock:
        _rewrites.append({"spec": spec, "module": module, "sites": sites, "cached": cached})


def record_wrap(spec: str, target: str) -> None:
    """A function-level fix was applied to ``target`` (``module:qualname``)."""
    with _lock:
        _wraps.append({"spec": spec, "target": target})


def record_unwrap(spec: str, target: str) -> None:
    """The fix :func:`record_wrap` recorded was taken out again."""
    with _lock:
        _wraps[:] = [w for w in _wraps if not (w["spec"] == spec and w["target"] == target)]


def record_alias(spec: str, alias: str, real: str) -> None:
    """A missing module was provided as an alias of its renamed successor."""
    with _lock:
        _aliases.append({"spec": spec, "alias": alias, "module": real})


def record_skip(spec: str, module: Optional[str], reason: str) -> None:
    """A spec or one of its modules was left untouched (stale, wrong version, imported early)."""
    with _lock:
        _skipped.append({"spec": spec, "module": module, "reason": reason})


def module_fates() -> tuple[set[str], dict[str, str]]:
    """The modules rewritten so far, and those left alone with the reason why."""
    with _lock:
        rewritten = {entry["module"] for entry in _rewrites}
        skipped = {e["module"]: e["reason"] for e in _skipped if e["module"] is not None}
    return rewritten, skipped


class Entries:
    """A consistent copy of everything recorded so far, one list per kind of entry."""

    def __init__(self) -> None:
        with _lock:
            self.rewrites = [dict(entry) for entry in _rewrites]
            self.wraps = [dict(entry) for entry in _wraps]
            self.skipped = [dict(entry) for entry in _skipped]
            self.aliases = [dict(entry) for entry in _aliases]
