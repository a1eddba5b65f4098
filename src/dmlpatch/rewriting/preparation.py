"""The first run after a library is installed or upgraded: saying why it is slow.

dmlpatch examines each module it may rewrite once (discovery's index) and rewrites and compiles
each target once (the bytecode cache); later runs read both from the cache. A cold start of
torch + transformers spends seconds there, and a user who sees the program stall for no reason
cannot tell it from a hang. So the time spent on cache misses is added up here, per top-level
package, and once a run is a second slower for it, one line says so, naming the package that
cost the most. Hits cost nothing: only a miss, which takes milliseconds, reads the clock.
"""

from __future__ import annotations

import _thread  # threading.Lock is this; importing threading costs start-up

from dmlpatch import log

#: Seconds of preparation a run may spend before it says so.
NOTICEABLE = 1.0

_lock = _thread.allocate_lock()
_seconds: dict[str, float] = {}
_modules: dict[str, int] = {}
_total = 0.0
_said = False


def charge(fullname: str, seconds: float) -> None:
    """``seconds`` spent preparing module ``fullname`` (examined or rewritten, not cached)."""
    global _total, _said
    top = fullname.partition(".")[0]
    with _lock:
        _seconds[top] = _seconds.get(top, 0.0) + seconds
        _modules[top] = _modules.get(top, 0) + 1
        _total += seconds
        if _said or _total < NOTICEABLE:
            return
        _said = True
        names = sorted(_seconds, key=lambda name: -_seconds[name])[:3]
        count = sum(_modules.values())
    import sys

    which = ", ".join(names)
    if sys.dont_write_bytecode:
        # Rewritten modules are cached as bytecode: without it, every run prepares again.
        log.say(
            f"preparing {which} for DirectML ({count} modules so far): python writes no "
            "bytecode here (PYTHONDONTWRITEBYTECODE or -B), so every run prepares them again"
        )
        return
    log.say(
        f"first run after installing or upgrading {which} (or dmlpatch): preparing them for "
        f"DirectML, once ({count} modules so far); later runs start from the cache"
    )


def quiet() -> None:
    """Say nothing in this process (``dmlpatch prepare``'s, which says what it does itself)."""
    global _said
    with _lock:
        _said = True
