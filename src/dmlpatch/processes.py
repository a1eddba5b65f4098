"""Which process of a job this is, in the words reports and announcements use.

torchrun's workers carry ``$RANK``; the processes ``torch.multiprocessing.spawn`` starts carry
nothing but the index it passes their function, which their ``multiprocessing`` process object
still holds (its target is torch's ``_wrap(fn, i, ...)``). Other multiprocessing children are
named as ``multiprocessing`` names them (``SpawnProcess-2``); the process the user started is
``main``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, Optional


def spawn_index() -> Optional[int]:
    """This process's index in ``torch.multiprocessing.spawn``, or None."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return None
    process = multiprocessing.current_process()
    target: Any = getattr(process, "_target", None)
    arguments: Sequence[Any] = getattr(process, "_args", ())
    if (
        getattr(target, "__name__", "") == "_wrap"
        and getattr(target, "__module__", "") == "torch.multiprocessing.spawn"
        and len(arguments) > 1
        and isinstance(arguments[1], int)
    ):
        return arguments[1]
    return None


def child_name() -> Optional[str]:
    """``rank N`` for a spawned rank, multiprocessing's name for another child; None for a
    process no multiprocessing parent started."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return None
    index = spawn_index()
    return f"rank {index}" if index is not None else str(multiprocessing.current_process().name)


def rank() -> str:
    """What ``{rank}`` in a report's path becomes: ``$RANK``, the spawn index, the child's
    name, or ``main``."""
    found = os.environ.get("RANK")
    if found:
        return found
    index = spawn_index()
    if index is not None:
        return str(index)
    name = child_name()
    return name if name is not None else "main"
