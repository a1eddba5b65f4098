"""The "running on ..." line, said when it becomes true, the same under every entry point.

The device is resolved when the program first imports torch, but that is not where the program
runs: a model whose device was chosen in code dmlpatch did not rewrite stays on the CPU. So the
line waits until a rewritten CUDA site (or a library fix) first hands the device to the program,
and a program that never asks for it is never told it runs there. The runner and ``import
dmlpatch.auto`` (both asked for by the user for this program) say at once where nothing will be
placed on an accelerator (``--device cpu``; a usable CUDA GPU); an activated environment's
processes, most of which never touch a device, say ``running on cpu`` only when a CUDA site asks.
"""

from __future__ import annotations

import os
import sys

from dmlpatch import log
from dmlpatch.environment_variables import DMLPATCH_ANNOUNCE_RANK_ZERO

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Union

    from dmlpatch.devices.resolution import Resolution

#: Set by the runner for its children: torchrun's rank-0 worker speaks for the job (the
#: launcher itself never touches a device).

_pending: Optional[Union[str, Callable[[], Optional[str]]]] = None
#: Whether a line waits for the device's first use (read by the allocation and copy kernels).
pending = False
_announced = False
#: The file name importlib's own frames carry (its import machinery is frozen into python).
_BOOTSTRAP = "<frozen importlib._bootstrap>"
#: How many times a rewritten site or fix handed the device out (the pytest plugin tells which
#: tests asked for it by the count before and after each).
_hand_outs = 0


def resolved(chosen: Resolution) -> None:
    """The line for a resolution: said now where nothing will be placed on an accelerator,
    else when the program first receives the device (once per process)."""
    global _announced
    if _announced:
        return
    _announced = True
    if not chosen.patches_needed:
        log.say(f"{chosen.why}; dmlpatch leaves it alone")
    elif not chosen.is_accelerator:
        log.say(f"running on cpu: {chosen.why}")
    else:
        where = f"{chosen.device} ({chosen.adapter})" if chosen.adapter else chosen.device
        on_first_use(f"running on {where}: {chosen.why}")


def resolved_when_asked(chosen: Resolution) -> None:
    """An activated environment's line: only once a CUDA site asks for the device."""
    global _announced
    if _announced or _worker():
        return
    _announced = True
    if not chosen.patches_needed:
        return  # CUDA serves the program: its sites are CUDA's own, nothing to say
    if not chosen.is_accelerator:
        on_first_use(f"running on cpu: {chosen.why}")
    else:
        where = f"{chosen.device} ({chosen.adapter})" if chosen.adapter else chosen.device
        on_first_use(f"running on {where}: {chosen.why}")


def resolved_unless_worker(chosen: Resolution) -> None:
    """``import dmlpatch.auto``'s line: the runner's, said by the program's own process (its
    spawned workers run the script again, and the import with it)."""
    if not _worker():
        resolved(chosen)


def resolved_in_child(chosen: Resolution) -> None:
    """The line of a process the runner's program started: a ``torch.multiprocessing`` rank
    (``mp.spawn(train, nprocs=2)``) that receives the device says so, naming itself; the
    process that started it may never touch the device. Which process it is is known only
    once multiprocessing has bootstrapped it (the device is resolved before: unpickling its
    function imports torch), so the line is worded at first use."""
    global _announced
    if _announced:
        return
    _announced = True
    if not chosen.patches_needed or not chosen.is_accelerator:
        return  # the runner said where the program runs
    where = f"{chosen.device} ({chosen.adapter})" if chosen.adapter else chosen.device
    line = f"running on {where}: {chosen.why}"

    def worded() -> Optional[str]:
        from dmlpatch import processes

        name = processes.child_name()
        return f"{name}: {line}" if name is not None else None

    on_first_use(worded)


def _worker() -> bool:
    """Whether this process is a multiprocessing child (DataLoader workers, spawned ranks):
    the process that started it speaks for the program."""
    import sys

    multiprocessing = sys.modules.get("multiprocessing")
    return multiprocessing is not None and multiprocessing.parent_process() is not None


def rank_zero_worker() -> bool:
    """Whether this process is the local-rank-0 torchrun worker of a runner's job."""
    return (
        os.environ.get("LOCAL_RANK") == "0" and os.environ.get(DMLPATCH_ANNOUNCE_RANK_ZERO) == "1"
    )


def on_first_use(line: Union[str, Callable[[], Optional[str]]]) -> None:
    """Say ``line`` (or what it returns, if anything) when the program first receives the
    device."""
    global _pending, pending
    _pending = line
    pending = True


def device_reached() -> None:
    """A tensor came to exist on the device, by any road: ``tensor.to(0)`` reaches
    PyTorch's current accelerator (DirectML's device, once registered) through no CUDA site.
    Says the pending line; called by the device's allocation and copy kernels, which test
    :data:`pending` first (a read of a module global)."""
    global _pending, pending
    if _pending is None:
        return
    line, _pending = _pending, None
    pending = False
    said = line if isinstance(line, str) else line()
    if said is not None:
        log.say(said)


def device_used() -> None:
    """A rewritten site or fix handed the device to the program (cheap after the first call).

    A hand-out while a module is being imported (a default argument, a module's constant:
    ``lightning.pytorch``'s ``default_device="cuda"``) says nothing yet: importing a library
    places nothing, and a launcher that imports it only starts the processes that compute (the
    ``fabric run`` CLI's parent, beside its one rank). The line then waits for the first use
    outside an import, or the first tensor on the device."""
    global _hand_outs
    _hand_outs += 1
    if _pending is not None and not _importing():
        device_reached()


def _importing() -> bool:
    """Whether the hand-out comes from a module being imported (walked only while a line
    waits). The main script's own code is never that, even where ``import dmlpatch.auto``
    runs it from inside that import."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_find_and_load" and code.co_filename == _BOOTSTRAP:
            return True
        if frame.f_globals.get("__name__") == "__main__":
            return False
        frame = frame.f_back
    return False


def handed_out() -> bool:
    """Whether a rewritten CUDA site or a library fix gave the program its device."""
    return _hand_outs > 0


def hand_outs() -> int:
    """How many times a rewritten CUDA site or a library fix gave the program its device."""
    return _hand_outs
