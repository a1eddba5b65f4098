"""In a pinned environment's pip: one line after pip refuses an install because of the pin.

pip says only ``The user requested (constraint) torch==2.4.1``; that this is torch-directml's
torch, kept by ``dmlpatch pin``, and what to do about it, only code inside pip can add. The pin's
``.pth`` starts this in pip's processes alone (``dmlpatch.pinning.pin``); it listens to the one pip
logger that explains a conflict and adds nothing to pip's own output.
"""

from __future__ import annotations

import atexit
import logging
import sys
from typing import Optional

#: The module of pip's resolver that reports conflicts (pip >= 20.3).
_REPORTER = "pip._internal.resolution.resolvelib.factory"
_CANNOT = "Cannot install "


class _Conflicts(logging.Handler):
    """Notes which pinned requirements pip's conflict report names, and what wanted another."""

    def __init__(self, pins: list[str]) -> None:
        super().__init__(logging.INFO)
        self.pins = pins
        self.wanted: Optional[str] = None
        self.named: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record pip formats itself; never fail pip over it
            return
        if text.startswith(_CANNOT):
            self.wanted = text[len(_CANNOT) :].split(" because ", 1)[0]
        for line in text.splitlines():
            _, marker, constraint = line.partition("(constraint) ")
            for pin in self.pins:
                if marker and _holds(constraint.strip(), pin) and pin not in self.named:
                    self.named.append(pin)


def _holds(constraint: str, pin: str) -> bool:
    """Whether pip's merged constraint (``torch<=2.14.1,==2.4.1``) includes ``pin``."""
    cut = next((i for i, c in enumerate(pin) if c in "=<>!~"), len(pin))
    name, clause = pin[:cut], pin[cut:]
    rest = constraint[len(name) :]
    return (
        constraint.lower().startswith(name.lower())
        and rest[:1] in ("=", "<", ">", "!", "~")
        and clause in rest.split(",")
    )


_watching = False


def watch(constraints: str) -> None:
    """Called from the pin's ``.pth`` in pip's processes; never raises."""
    global _watching
    if _watching:  # a venv's lib64 -> lib link has site.py read the same .pth twice
        return
    _watching = True
    try:
        with open(constraints, encoding="utf-8") as stream:
            pins = [line.strip() for line in stream if line.strip() and line[0] != "#"]
        handler = _Conflicts(pins)
        reporter = logging.getLogger(_REPORTER)
        reporter.addHandler(handler)
        if reporter.getEffectiveLevel() > logging.INFO:
            # pip -q raises the level; records below its handlers' levels still print nothing.
            reporter.setLevel(logging.INFO)
        atexit.register(_say, handler)
    except Exception:  # the pin must never stop pip
        return


def _say(handler: _Conflicts) -> None:
    if not handler.named:
        return
    pinned = " and ".join(handler.named)
    sys.stderr.write(
        f"dmlpatch: pip refused {handler.wanted or 'the install'}: {pinned} is torch-directml's "
        f"own, kept in this environment by `dmlpatch pin`; install a version that accepts "
        f"{pinned}, or run `dmlpatch unpin` first (DirectML then fails until torch-directml's "
        "torch is back)\n"
    )
