"""Process start-up for activated environments and child processes.

Called from the ``.pth`` line that ``dmlpatch activate`` writes and from the ``sitecustomize``
that ``python -m dmlpatch`` puts on children's ``PYTHONPATH``. It must stay cheap (no torch)
and must never stop a program from starting: problems become one warning line.
"""

from __future__ import annotations

import atexit
import os

from dmlpatch import log, report
from dmlpatch.devices import announce, resolution
from dmlpatch.errors import DmlpatchError
from dmlpatch.patching import engine
from dmlpatch.rewriting import hook, main_script, spawn_main
from dmlpatch.startup import first_backward

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

REPORT_VAR = report.REPORT_VAR

_started = False
_active = False


def startup(device: Optional[str] = None, main: bool = True) -> None:
    """Activate patches for this process; ``$DMLPATCH_DEVICE`` wins over ``device``.

    ``main``: also rewrite the main script when the interpreter is about to run one (the
    ``.pth`` and children's start-up; ``import dmlpatch.auto`` comes too late for that).
    """
    global _started, _active
    if _started or engine.disabled():
        return
    _started = True
    try:
        engine.install(os.environ.get(resolution.ENV_VAR) or device)
    except DmlpatchError as error:
        log.say(f"warning: patches not active in this process: {error}")
        return
    _active = True
    hook.when_imported("torch", first_backward.arm)
    if announce.rank_zero_worker():
        resolution.when_resolved(announce.resolved)
    elif os.environ.get(announce.RANK_ZERO_VAR) != "1" and "LOCAL_RANK" not in os.environ:
        # Not a child of the runner (whose line the runner says): import dmlpatch.auto says
        # what the runner would; an activated process speaks when a CUDA site asks.
        resolution.when_resolved(
            announce.resolved_when_asked if main else announce.resolved_unless_worker
        )
    spawn_main.install()
    destination = os.environ.get(REPORT_VAR)
    if destination:
        atexit.register(_write_report_if_used, destination)
    if main:
        main_script.arm_for_activation()


def started() -> bool:
    """Whether :func:`startup` activated patches in this process."""
    return _active


def _write_report_if_used(destination: str) -> None:
    # Every Python process of an activated environment runs this; only those that touched a
    # device (pip, say, never does) have anything to report.
    if resolution.resolved_or_none() is not None:
        report.write(destination)
