"""dmlpatch's voice on stderr: one prefixed line per message, each warning said once."""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import os
import sys

from dmlpatch.environment_variables import DMLPATCH_DEBUG, DMLPATCH_VERBOSE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

_said: set[str] = set()
_lock = _thread.allocate_lock()


def verbose() -> bool:
    """``-v`` on the command line or ``DMLPATCH_DEBUG=1`` / ``DMLPATCH_VERBOSE=1``."""
    return os.environ.get(DMLPATCH_VERBOSE) == "1" or debug_enabled()


def debug_enabled() -> bool:
    return os.environ.get(DMLPATCH_DEBUG) == "1"


#: Where lines go instead of stderr while another tool holds it (pytest's capture would put
#: them in a test's captured output: see ``dmlpatch.pytest_plugin``).
_divert: Optional[Callable[[str], None]] = None


def divert(sink: Optional[Callable[[str], None]]) -> None:
    """Hand every line to ``sink`` from now on; None: to stderr again."""
    global _divert
    _divert = sink


def say(message: str) -> None:
    sink = _divert
    if sink is not None:
        sink(f"dmlpatch: {message}")
        return
    sys.stderr.write(f"dmlpatch: {message}\n")
    sys.stderr.flush()


def info(message: str) -> None:
    """Said only when verbose."""
    if verbose():
        say(message)


def warn_once(key: str, message: str) -> None:
    """A warning said at most once per process for ``key``."""
    say_once(key, f"warning: {message}")


def say_once(key: str, message: str) -> None:
    """A line said at most once per process for ``key``."""
    with _lock:
        if key in _said:
            return
        _said.add(key)
    say(message)


def swallowed(where: str, error: BaseException) -> None:
    """An error a path that must never break the program (the accounting) caught and dropped:
    said once per place and error type under ``DMLPATCH_DEBUG=1``, so that a count that came
    out short can be traced."""
    if debug_enabled():
        kind = type(error).__name__
        say_once(f"swallowed:{where}:{kind}", f"debug: {where} dropped a call: {kind}: {error}")
