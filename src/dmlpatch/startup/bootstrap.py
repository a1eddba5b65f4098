"""Process start-up for activated environments and child processes.

Called from the ``.pth`` line that ``dmlpatch activate`` writes, from the ``sitecustomize`` that
``python -m dmlpatch`` puts on children's ``PYTHONPATH`` and by ``import dmlpatch.auto``; it is
:func:`dmlpatch.startup.sequence.start` in its lenient form. It must stay cheap (no torch) and
must never stop a program from starting: problems become one warning line.
"""

from __future__ import annotations

import os

from dmlpatch.devices import announce, resolution
from dmlpatch.startup import sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


def startup(device: Optional[str] = None, main: bool = True) -> sequence.Startup:
    """Patch this process; ``$DMLPATCH_DEVICE`` wins over ``device``.

    ``main``: also rewrite the main script when the interpreter is about to run one (the
    ``.pth`` and children's start-up; ``import dmlpatch.auto`` comes too late for that).
    """
    return sequence.start(
        os.environ.get(resolution.ENV_VAR) or device,
        strict=False,
        speaks=announce.rank_zero_worker(),
        main=main,
    )


def started() -> bool:
    """Whether patches are active in this process."""
    return bool(sequence.current())
