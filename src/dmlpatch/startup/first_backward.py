"""The device is resolved before an activated program's first backward pass.

PyTorch's autograd engine sizes its per-device queues once, at the first backward pass of the
process, from the devices registered then. A DirectML backend registered later has no queue,
and every backward on it fails: ``RuntimeError: 0 <= device.index() && device.index() <
static_cast<c10::DeviceIndex>(device_ready_queues_.size()) INTERNAL ASSERT FAILED``
(microsoft/DirectML#668; the simulated device reproduces it). ``python -m dmlpatch`` resolves
the device, and so registers the backend, when the program imports torch; an activated
process (``dmlpatch activate``, ``import dmlpatch.auto``, a child of the runner) resolves it at
its first CUDA site, which may come after a backward on the CPU: a sanity check, a warm-up.

So when such a process imports torch, the engine that ``torch.autograd`` calls is wrapped for
one call: the first backward resolves the device, puts the engine back and runs. Processes
that never run backward (DataLoader workers) never load the backend for it, and later backward
passes call the engine directly.
"""

from __future__ import annotations

import threading
from typing import Any

from dmlpatch import log
from dmlpatch.errors import DmlpatchError

_lock = threading.Lock()


class _FirstBackward:
    """Stands in for ``Variable._execution_engine`` until the first backward pass."""

    def __init__(self, holder: Any, engine: Any) -> None:
        self._holder = holder
        self._engine = engine

    def run_backward(self, *args: Any, **kwargs: Any) -> Any:
        with _lock:
            if self._holder._execution_engine is self:
                self._holder._execution_engine = self._engine
                _resolve()
        return self._engine.run_backward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def _resolve() -> None:
    from dmlpatch.devices import resolution

    if resolution.resolved_or_none() is not None or resolution.resolving():
        return
    try:
        resolution.current()
    except DmlpatchError as error:
        # The program's first CUDA site will meet the same error, in its own traceback.
        log.warn_once("first-backward", f"device not resolved before backward: {error}")


def arm(torch: Any) -> None:
    """Wrap the autograd engine of the imported ``torch`` for its first backward pass."""
    from dmlpatch.devices import resolution

    if resolution.resolved_or_none() is not None:
        return
    holder = torch.autograd.variable.Variable
    with _lock:
        engine = holder._execution_engine
        if not isinstance(engine, _FirstBackward):
            holder._execution_engine = _FirstBackward(holder, engine)


def disarm() -> None:
    """Undo :func:`arm` where the first backward pass has not come yet."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return
    holder = torch.autograd.variable.Variable
    with _lock:
        engine = holder._execution_engine
        if isinstance(engine, _FirstBackward):
            holder._execution_engine = engine._engine
