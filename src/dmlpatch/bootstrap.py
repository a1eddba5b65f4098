"""Process start-up for activated environments and child processes.

Called from the ``.pth`` line that ``dmlpatch activate`` writes and from the ``sitecustomize``
that ``python -m dmlpatch`` puts on children's ``PYTHONPATH``. It must stay cheap (no torch)
and must never stop a program from starting: problems become one warning line.
"""

from __future__ import annotations

import atexit
import os
from typing import Optional

from dmlpatch import engine, log, spawn_main
from dmlpatch.errors import DmlpatchError

REPORT_VAR = "DMLPATCH_REPORT"

_started = False


def startup(device: Optional[str] = None) -> None:
    """Activate patches for this process; ``$DMLPATCH_DEVICE`` wins over ``device``."""
    global _started
    if _started or engine.disabled():
        return
    _started = True
    try:
        engine.activate(os.environ.get("DMLPATCH_DEVICE") or device)
    except DmlpatchError as error:
        log.say(f"warning: patches not active in this process: {error}")
        return
    spawn_main.install()
    destination = os.environ.get(REPORT_VAR)
    if destination:
        atexit.register(_write_report_if_used, destination)


def _write_report_if_used(destination: str) -> None:
    from dmlpatch import report, resolution

    # Every Python process of an activated environment runs this; only those that touched a
    # device (pip, say, never does) have anything to report.
    if resolution.resolved_or_none() is not None:
        report.write(destination)
