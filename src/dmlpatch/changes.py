"""The ledger of what dmlpatch changed in this process, each change with its undo, in order.

Every installer records here what it puts in (an import hook on ``sys.meta_path``, kernels
registered through ``torch.library``, a replaced function such as ``nn.Module._apply`` or
``torch._utils._rebuild_tensor``, pickling reducers, an environment variable, an exit handler)
and forgets it when it takes it out itself. :func:`undo` drains the ledger last first, so that
``dmlpatch.unpatch()`` leaves the process as it found it, and says in one line what cannot be
undone (a third-party import hook that wrapped dmlpatch's own, the simulated device's
backend, which torch keeps for the life of the process). ``dmlpatch check`` and the run report
list what was installed (:func:`listing`).

A leaf module: importing it costs start-up nothing (no ``typing``, ``threading`` or torch).
"""

from __future__ import annotations

import _thread  # threading.Lock is this; importing threading costs start-up
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NamedTuple, Optional

    from dmlpatch.report_types import Installed
else:
    from dmlpatch._tuple import NamedTuple

#: The kinds of change, as the listing names them.
KINDS = (
    "import hook",
    "kernels",
    "function",
    "reducers",
    "environment",
    "exit handler",
    "callback",
    "device",
)


class Change(NamedTuple):
    """One change to the process."""

    #: Who made it, unique in the ledger: an installer's module, or the module plus a name.
    key: str
    kind: str
    #: What it is, for a reader: ``nn.Module._apply``, ``943 kernels for PrivateUse1``.
    what: str
    #: Takes it out again; None where that is impossible (``why_not`` says why).
    undo: Optional[Callable[[], None]] = None
    why_not: str = ""


_lock = _thread.allocate_lock()
_entries: list[Change] = []


def record(
    key: str,
    kind: str,
    what: str,
    undo: Optional[Callable[[], None]],
    why_not: str = "",
) -> Change:
    """Note a change just made; a change of the same ``key`` is replaced in place (an installer
    run again), keeping its position."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of change {kind!r}")
    if undo is None and not why_not:
        raise ValueError(f"{key}: a change that cannot be undone says why")
    change = Change(key, kind, what, undo, why_not)
    with _lock:
        for i, existing in enumerate(_entries):
            if existing.key == key:
                _entries[i] = change
                return change
        _entries.append(change)
    return change


def forget(key: str) -> None:
    """The installer ``key`` took its change out itself."""
    with _lock:
        _entries[:] = [entry for entry in _entries if entry.key != key]


def entries() -> tuple[Change, ...]:
    with _lock:
        return tuple(_entries)


def recorded(key: str) -> bool:
    with _lock:
        return any(entry.key == key for entry in _entries)


def _get(key: str) -> Optional[Change]:
    with _lock:
        return next((entry for entry in _entries if entry.key == key), None)


def replace(owner: Any, name: str, value: Any, key: str, what: str = "") -> Change:
    """Set ``owner.name`` to ``value``, recording how to put back what was there before
    dmlpatch first replaced it (or remove the attribute, where there was none)."""
    existing = _get(key)
    if existing is not None:  # replaced again: the original is already kept
        setattr(owner, name, value)
        return existing
    missing = object()
    original = vars(owner).get(name, missing)
    setattr(owner, name, value)

    def put_back() -> None:
        if original is not missing:
            setattr(owner, name, original)
        elif name in vars(owner):
            delattr(owner, name)

    label = what or f"{getattr(owner, '__qualname__', getattr(owner, '__name__', owner))}.{name}"
    return record(key, "function", label, put_back)


def set_environment(name: str, value: str, key: str = "") -> Change:
    """Set ``os.environ[name]``, recording the value it had before dmlpatch first set it (or
    its absence)."""
    key = key or f"environment:{name}"
    existing = _get(key)
    if existing is not None:
        os.environ[name] = value
        return existing
    before = os.environ.get(name)
    os.environ[name] = value

    def put_back() -> None:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before

    return record(key, "environment", name, put_back)


def undo() -> list[Change]:
    """Take every recorded change out, last first. Returns those that could not be undone
    (kept in the ledger, which still lists them)."""
    kept: list[Change] = []
    while True:
        with _lock:
            if not _entries:
                break
            change = _entries.pop()
        if change.undo is None:
            kept.append(change)
            continue
        change.undo()
    kept.reverse()
    with _lock:
        _entries[:0] = kept
    return kept


def listing() -> list[Installed]:
    """The changes in force, for the report and ``dmlpatch check --json``."""
    return [
        {"kind": c.kind, "what": c.what, "undoable": c.undo is not None, "why_not": c.why_not}
        for c in entries()
    ]
