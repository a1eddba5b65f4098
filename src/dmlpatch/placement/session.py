"""Turning compute-placement accounting on for a process, and its warning at exit.

On by default wherever dmlpatch may send a program to an accelerator (runner,
``dmlpatch.auto``, an activated environment): the specs engine imports this module when the
program imports torch (start-up does not pay for it) and :func:`start` puts the layer hooks in;
they come out if the device resolves to the CPU or to a usable CUDA GPU. ``DMLPATCH_ACCOUNTING=0``
turns it off; ``DMLPATCH_QUIET=1`` keeps the exit warning to itself, and a program that never
asked for CUDA gets none. Where the backend is DirectML's (or simulates it), heavy operators its
CPU fallback runs are counted by operator (:mod:`.fallbacks`). ``dmlpatch check`` counts
operators instead (:mod:`.operators`) and says its own verdict.
"""

from __future__ import annotations

import os

from dmlpatch.environment_variables import DMLPATCH_ACCOUNTING, DMLPATCH_QUIET

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Optional

    from dmlpatch.devices.resolution import Resolution
    from dmlpatch.report_types import Compute


_by_operators = False
_lines = False
_started = False
_section: Optional[Compute] = None


def by_operators() -> None:
    """``dmlpatch check``: no layer hooks and no exit warning; it keeps its own counter."""
    global _by_operators
    _by_operators = True


def keep_lines() -> None:
    """The report is a page: record the line of every layer call, not only of CPU ones."""
    global _lines
    _lines = True


def _counts_for(chosen: Resolution) -> bool:
    return chosen.is_accelerator and chosen.patches_needed


def start(torch: ModuleType) -> None:
    """The program imported torch: count its layer calls, unless turned off (once per process)."""
    global _started
    if _started or _by_operators or os.environ.get(DMLPATCH_ACCOUNTING) == "0":
        return
    _started = True
    from dmlpatch.devices import resolution

    chosen = resolution.resolved_or_none()
    if chosen is not None and not _counts_for(chosen):
        return
    from dmlpatch.placement import module_hooks

    book = module_hooks.install()
    if _lines:
        book.keep_lines()
    resolution.when_resolved(_on_resolved)
    import atexit

    from dmlpatch import changes

    atexit.register(_warn_at_exit)

    def stop() -> None:
        global _started
        atexit.unregister(_warn_at_exit)
        resolution.forget_when_resolved(_on_resolved)
        _started = False

    changes.record(__name__, "exit handler", "the placement warning, said at exit", stop)


def _on_resolved(chosen: Resolution) -> None:
    if not _counts_for(chosen):
        from dmlpatch.placement import ledger, module_hooks

        module_hooks.uninstall()
        ledger.stop()
        return
    if chosen.backend in ("sim", "directml"):
        from dmlpatch.placement import fallbacks

        try:
            fallbacks.install()
        except RuntimeError as error:  # a registration torch refuses: count layers alone
            from dmlpatch import log

            log.info(f"CPU fallbacks not counted by operator: {error}")


def selected() -> Optional[Resolution]:
    """The device dmlpatch selected, resolved now if the program never asked for it and torch
    is loaded (an activated program whose device was chosen where nothing was rewritten);
    None when it cannot be resolved, or the program never imported torch (importing it at
    exit is refused once the interpreter has begun shutting down)."""
    import sys

    from dmlpatch.devices import resolution
    from dmlpatch.errors import DmlpatchError

    chosen = resolution.resolved_or_none()
    if chosen is None and "torch" in sys.modules:
        try:
            chosen = resolution.current()
        except DmlpatchError:
            return None
    return chosen


def section() -> Optional[Compute]:
    """The report's ``compute`` section, or None when nothing was counted in this process.

    Made once, at exit (the likely cause reads source files): the warning and the report
    share it.
    """
    global _section
    import sys

    if _section is None and "dmlpatch.placement.ledger" in sys.modules:
        from dmlpatch.placement import ledger, summary

        book = ledger.current()
        if book is None or not book.model_compute():
            return None
        chosen = selected()
        if chosen is None or not _counts_for(chosen):
            return None
        try:
            _section = summary.compute(book, chosen.device, chosen.type)
        except Exception as error:  # at exit: the report and the program's status come first
            from dmlpatch import log

            log.info(f"could not summarise where compute ran: {error!r}")
            return None
        by_test = sys.modules.get("dmlpatch.placement.by_test")
        if by_test is not None and by_test.counted():
            # A test suite, each test judged alone by the pytest plugin: a cause found for the
            # whole session would name one test's deliberate CPU placement for all of them.
            _section["tests"] = by_test.as_dict()
            _section["likely_cause"] = None
    return _section


def _asked(found: Compute) -> bool:
    """Whether the program asked for the accelerator: a rewritten site or fix handed it out,
    some compute ran there, or a CUDA site that dmlpatch did not rewrite chose the CPU. A
    program that never mentions CUDA is told nothing about where its CPU compute ran."""
    from dmlpatch.devices import announce

    if announce.handed_out() or found["on_device"]["calls"]:
        return True
    cause = found["likely_cause"]
    return cause is not None and cause["kind"] == "not-rewritten"


def _warn_at_exit() -> None:
    if os.environ.get(DMLPATCH_QUIET) == "1" or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    import sys

    from dmlpatch import log
    from dmlpatch.placement import summary

    found = section()
    if found is None or not _asked(found):
        return
    line = summary.exit_warning(found, sys.argv)
    if line is not None:
        log.say(f"warning: {line}")
    elif found.get("cpu_fallbacks"):  # the warning above names them already
        through = summary.fallback_line(found, sys.argv)
        if through is not None:
            log.say(through)
