"""Training steps and wall time, counted so that modelled time can be said per step.

A step is an optimizer's ``step()``: one post-step hook for every optimizer in the process
(``torch.optim.optimizer.register_optimizer_step_post_hook``), which costs an addition per step
and nothing per operator. A program that never steps an optimizer (inference) is priced per run.
"""

from __future__ import annotations

import time
from typing import Any, Optional

_steps = 0
_since = time.perf_counter()
_handle: Optional[Any] = None


def _stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _steps
    _steps += 1


def install() -> None:
    """Count optimizer steps from now on (once per process; undone with the other changes)."""
    global _handle
    if _handle is not None:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from dmlpatch import changes

    _handle = register_optimizer_step_post_hook(_stepped)
    restart()
    changes.record(
        "dmlpatch.costs.steps",
        "callback",
        "an optimizer step hook (modelled DirectML time is said per training step)",
        _uninstall,
    )


def _uninstall() -> None:
    global _handle
    if _handle is not None:
        _handle.remove()
        _handle = None


def restart() -> None:
    """Count from now (``dmlpatch check`` as the program starts; the counters reset with it)."""
    global _steps, _since
    _steps, _since = 0, time.perf_counter()


def counted() -> tuple[int, float]:
    """(optimizer steps, wall seconds) since the count started."""
    return _steps, time.perf_counter() - _since
