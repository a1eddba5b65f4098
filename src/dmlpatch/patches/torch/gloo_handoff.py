"""gloo's process group, holding on to what Python hands it until gloo's worker has let go.

gloo runs every collective on a worker thread of its own (a C++ thread) and drops its references
to the collective's tensors there, after completing it. A tensor created in Python whose last
reference is gloo's then frees its Python object on that thread, which has to take the GIL; so
does a Python callback chained to the collective's future with ``Future.then``. When the
interpreter is already finalizing (a rank that returns right after its last step), CPython ends
such a thread inside a C++ destructor and the process aborts with "terminate called without an
active exception" (SIGABRT, which ``torch.multiprocessing.spawn`` reports as a dead rank).

:class:`GlooHandoff` therefore makes sure gloo's worker never holds the last reference to a
Python object:

- the process group gets one worker thread, so collectives run in the order they were queued
  and work *k+1* completing proves that the worker has released work *k*;
- everything handed to gloo (the work and its arguments, tensors included) stays
  referenced here until a later work has completed (:meth:`GlooHandoff.settle`);
- nothing Python is chained to gloo's futures: what has to happen after a gradient bucket's
  allreduce runs on a Python thread of this module (:meth:`GlooHandoff.then_copy`);
- :meth:`GlooHandoff.close` (``destroy_process_group``, garbage collection, or at exit before
  the interpreter finalizes) joins gloo's worker before letting go of the rest.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from collections import deque
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

_open: weakref.WeakSet[GlooHandoff] = weakref.WeakSet()
_open_lock = threading.Lock()
_STOP_TIMEOUT_S = 10.0


@atexit.register
def _close_all_at_exit() -> None:
    # atexit handlers run before the interpreter starts finalizing: threads may still take
    # the GIL here, so this is the last moment to wind gloo down safely. (This module is
    # imported only by a process that makes a DirectML process group.)
    with _open_lock:
        handoffs = list(_open)
    for handoff in handoffs:
        handoff.close()


def _devices() -> list[Any]:
    """The network devices torch's own gloo constructor would use: those named in
    ``$GLOO_SOCKET_IFNAME`` (machines with several interfaces set it), else the default."""
    names = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if len(names) > 1:
        return [dist.ProcessGroupGloo.create_device(interface=name) for name in names.split(",")]
    return [dist.ProcessGroupGloo.create_default_device()]


class GlooHandoff:
    """A ``ProcessGroupGloo`` with one worker thread, and what Python handed to it."""

    _closed = True  # until __init__ completes: an instance whose gloo failed has nothing to close

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = _devices()
        options._threads = 1
        self._gloo: Optional[Any] = dist.ProcessGroupGloo(store, rank, size, options)
        self._handed: deque[tuple[Any, tuple[Any, ...]]] = deque()  # (work, its arguments)
        self._lock = threading.Lock()
        self._finisher: Optional[_Finisher] = None
        self._closed = False
        with _open_lock:
            _open.add(self)

    def start(self, name: str, *args: Any) -> Any:
        """gloo's collective ``name`` on ``args``; its work (:meth:`settle` it once waited on)."""
        with self._lock:
            if self._gloo is None:
                raise RuntimeError("dmlpatch: this process group has been shut down")
            work = getattr(self._gloo, name)(*args)
            # Queued and recorded under one lock: the record's order is gloo's queue order.
            self._handed.append((work, args))
        return work

    def settle(self, work: Any) -> None:
        """``work`` has completed: let go of everything handed to gloo before it."""
        released = []
        with self._lock:
            # Absent when a later work was settled first (it let go of this one already).
            if any(entry[0] is work for entry in self._handed):
                while self._handed[0][0] is not work:
                    released.append(self._handed.popleft())
        del released  # freed here, on a Python thread, outside the lock

    def then_copy(self, work: Any, host: torch.Tensor, device_tensor: torch.Tensor) -> Any:
        """A future completed with ``device_tensor`` once ``work`` is done and ``host`` is
        copied into it (on this module's Python thread, not gloo's)."""
        carrier: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        with self._lock:
            if self._finisher is None:
                self._finisher = _Finisher(weakref.ref(self))
            finisher = self._finisher
        # The finisher completes ``carrier``, so this callback runs on that Python thread.
        # It turns a failure set there into the future's own error, which DDP raises as is
        # (a plain exception *value* would reach DDP as "Unable to cast ... to Tensor").
        result = carrier.then(_value)
        finisher.submit((work, host, device_tensor, carrier))
        return result

    def close(self) -> None:
        """Join gloo's worker, then let go of what it was handed (idempotent).

        A collective still in flight (a peer that died mid-step) would keep gloo's worker busy
        until gloo's timeout, and joining it would hang the exit: then nothing is let go.
        """
        if self._closed:
            return
        with self._lock:
            finisher, self._finisher = self._finisher, None
        if finisher is not None and not finisher.stop(timeout=_STOP_TIMEOUT_S):
            return
        with self._lock:
            if not all(entry[0].is_completed() for entry in self._handed):
                return
            gloo, self._gloo = self._gloo, None
        # The last reference: gloo's destructor waits for its queue and joins its worker, which
        # needs no GIL for that, since everything Python-owned it holds is referenced below too.
        del gloo
        with self._lock:
            handed = list(self._handed)
            self._handed.clear()
        del handed
        self._closed = True
        with _open_lock:
            _open.discard(self)

    def __del__(self) -> None:
        if self._closed:
            return
        # Not contextlib.suppress: at interpreter teardown this module's globals may be gone.
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass


class _Finisher:
    """The Python thread that finishes gradient-bucket allreduces: it waits for gloo's work,
    copies the reduced host tensor into the device bucket and completes DDP's future."""

    def __init__(self, handoff: weakref.ref[GlooHandoff]) -> None:
        self._items: queue.SimpleQueue[Optional[tuple[Any, ...]]] = queue.SimpleQueue()
        # A daemon: a program that never destroys its process group must still be able to exit
        # (the atexit handler stops it first).
        self._thread = threading.Thread(
            target=_finish, args=(self._items, handoff), name="dmlpatch-gloo-finisher", daemon=True
        )
        self._thread.start()

    def submit(self, item: tuple[Any, ...]) -> None:
        self._items.put(item)

    def stop(self, timeout: float) -> bool:
        """Ask the thread to end after what it has; False if it is still busy after ``timeout``."""
        self._items.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True


def _value(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    return done.value()


def _finish(items: queue.SimpleQueue[Optional[tuple[Any, ...]]], handoff: Any) -> None:
    while True:
        item = items.get()
        if item is None:
            return
        work, host, device_tensor, result = item
        del item
        try:
            work.wait()
            device_tensor.copy_(host)
        except BaseException as error:  # a peer gone, gloo's timeout: DDP's backward raises it
            result.set_exception(error)
        else:
            result.set_result(device_tensor)
        del host, device_tensor, result
        owner = handoff()
        if owner is not None:
            owner.settle(work)
        del owner, work
