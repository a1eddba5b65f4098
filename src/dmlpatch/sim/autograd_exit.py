"""Autograd's adapter threads let go of the program's last backward pass before Python finalizes.

A backward pass over device tensors runs on the autograd engine's thread for that adapter
(``pt_autograd_<index>``), which holds the pass's ``GraphTask`` until just after it has woken
the thread that called ``backward()``: that thread may return first, and the adapter's thread
then destroys the task, with the thread-local state it captured. From some torch release after
2.4 on, ``torch.autograd.backward`` stashes a ``contextvars.Context`` in that state
(``torch.autograd.graph._engine_run_backward``); under 2.4 only a Python mode or saved-tensor
hook active around ``backward()`` puts a Python object there. Dropping one takes the GIL. When
the program ends right after its backward pass, the main thread keeps the GIL into
``Py_FinalizeEx``, and once finalization has begun CPython ends any other thread that asks for
the GIL with ``pthread_exit``, whose unwinding meets ``~GraphTask``, a ``noexcept`` destructor:
``terminate called without an active exception``, exit code 134, after the program's own
output. The race is PyTorch's (CUDA's autograd threads run the same code); on torch 2.14 it
ended about one simulated-device run in five.

At exit, before finalization, an empty backward pass goes through each adapter's thread. The
thread reaches it only after finishing the iteration that held the program's task, and finishes
that while the GIL can still be taken (the engine releases it while it waits). The pass calls
the engine directly, not through ``torch.autograd.backward``, so its task's thread-local state
holds no Python object. Its graph does (its node is a Python function, its tensors are
Python's), and the adapter's thread lets go of the pass just after this thread has returned,
as it did of the program's: so the pass's objects are kept for the rest of the process, and
that thread never drops the last reference to one, which would take the GIL during
finalization and abort the run as above. Its tensors are made without dispatching an operator
(``dmlpatch_sim::uncounted_empty``) and its node computes nothing, so the counters, costs and
memory figures that a run report written later in the exit reads are as the program left them.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
from typing import Any

import torch

from dmlpatch.environment_variables import DMLPATCH_DEBUG
from dmlpatch.sim import _state

_installed = False
#: The exit passes' Python objects, never freed (see the module's docstring).
_kept: list[Any] = []


class _NoGradient(torch.autograd.Function):
    """A node on an adapter that computes nothing: its backward returns no gradient."""

    @staticmethod
    def forward(ctx: Any, leaf: torch.Tensor, index: int) -> torch.Tensor:
        return torch.ops.dmlpatch_sim.uncounted_empty(index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None


def install() -> None:
    """Drain the adapters' autograd threads at exit (once per process)."""
    global _installed
    if not _installed:
        atexit.register(drain)
        _installed = True


def drain() -> None:
    """One empty backward pass through each simulated adapter's autograd thread."""
    if not _autograd_threads_started():
        return
    try:
        _forget_stashed_context()
        engine = torch._C._ImperativeEngine()
        with torch.enable_grad():
            for index in range(_state.device_count()):
                _pass_through(engine, index)
    except Exception as error:  # an exit must not fail for a workaround
        if os.environ.get(DMLPATCH_DEBUG) == "1":
            print(f"dmlpatch: autograd threads not drained at exit: {error}", file=sys.stderr)


def _pass_through(engine: Any, index: int) -> None:
    # A CPU leaf: the node's task goes to the adapter's thread because its gradient is on the
    # adapter, and the leaf's AccumulateGrad, given no gradient, runs on this thread.
    leaf = torch.empty(0, requires_grad=True)
    out = _NoGradient.apply(leaf, index)
    grad = torch.ops.dmlpatch_sim.uncounted_empty(index)
    _keep(leaf, out, grad)
    engine.run_backward(
        (out,), (grad,), False, False, (), allow_unreachable=True, accumulate_grad=True
    )


def _keep(*objects: Any) -> None:
    if not _kept:
        # A reference finalization does not know of: module globals are cleared there.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_kept))
    _kept.extend(objects)


def _forget_stashed_context() -> None:
    """Torch releases that stash the context without erasing it would hand it to the pass."""
    if getattr(torch._C, "_is_key_in_tls", None) is None:
        return
    if torch._C._is_key_in_tls("context") and hasattr(torch._C, "_remove_obj_from_tls"):
        torch._C._remove_obj_from_tls("context")


def _autograd_threads_started() -> bool:
    """Whether a backward pass has started the engine's threads (named ``pt_autograd_<n>``).

    Without one there is nothing to drain, and the pass would start them at exit, asking
    every registered backend (CUDA's too) for its device count. Where threads cannot be
    listed (no /proc), the pass runs anyway.
    """
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return True
    for task in os.listdir(tasks):
        try:
            with open(os.path.join(tasks, task, "comm")) as comm:
                if comm.read().startswith("pt_autograd_"):
                    return True
        except OSError:
            continue
    return False
