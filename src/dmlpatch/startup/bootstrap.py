"""Process start-up for activated environments and child processes.

Called from the ``.pth`` line that ``dmlpatch activate`` writes, from the ``sitecustomize`` that
``python -m dmlpatch`` puts on children's ``PYTHONPATH`` and by ``import dmlpatch.auto``; it is
:func:`dmlpatch.startup.sequence.start` in its lenient form. It must stay cheap (no torch) and
must never stop a program from starting: problems become one warning line.
"""

from __future__ import annotations

import os

from dmlpatch.devices import announce, resolution
from dmlpatch.environment_variables import DMLPATCH_ANNOUNCE_RANK_ZERO, DMLPATCH_DEVICE
from dmlpatch.startup import sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional


def startup(device: Optional[str] = None, main: bool = True) -> sequence.Startup:
    """Patch this process; ``$DMLPATCH_DEVICE`` wins over ``device``.

    ``main``: also rewrite the main script when the interpreter is about to run one (the
    ``.pth`` and children's start-up; ``import dmlpatch.auto`` comes too late for that).
    """
    return sequence.start(
        os.environ.get(DMLPATCH_DEVICE) or device,
        strict=False,
        speaks=_announcer(main),
        main=main,
    )


def _announcer(main: bool) -> Optional[Callable[[resolution.Resolution], None]]:
    if announce.rank_zero_worker():
        return announce.resolved
    if "LOCAL_RANK" in os.environ:
        return None  # torchrun's workers: rank 0 speaks for the job (above)
    if os.environ.get(DMLPATCH_ANNOUNCE_RANK_ZERO) == "1":
        # A child of the runner: a torch.multiprocessing rank (mp.spawn) that receives the
        # device says so itself, naming itself; other children leave it to the runner.
        return announce.resolved_in_child
    # Not a child of the runner (whose line the runner says): import dmlpatch.auto says what
    # the runner would; an activated process speaks when a CUDA site asks.
    return announce.resolved_when_asked if main else announce.resolved_unless_worker


def started() -> bool:
    """Whether patches are active in this process."""
    return bool(sequence.current())
