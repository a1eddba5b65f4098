"""Where fixed and forced-CPU calls are counted: the simulated device's counters, or the
dispatch-level observer on real DirectML (:mod:`dmlpatch.opfix.observer`) while it is on.

With neither, :func:`record` is a call to a function that returns at once.
"""

from __future__ import annotations

from typing import Callable, Optional

Sink = Callable[[str, str, int, int, int], None]

_sink: Optional[Sink] = None


def record(category: str, name: str, copies: int = 0, nbytes: int = 0, cpu_ns: int = 0) -> None:
    """Count one call of ``name`` served as ``category`` (``fixed`` or ``fallback``), with the
    host<->device copies it made and the nanoseconds its CPU kernel took (a fallback's)."""
    sink = _sink
    if sink is not None:
        sink(category, name, copies, nbytes, cpu_ns)


def use_sim_counters() -> None:
    """Count in the simulated device's backend (``dmlpatch_sim::record_call``)."""
    import torch

    set_sink(torch.ops.dmlpatch_sim.record_call)


def set_sink(sink: Optional[Sink]) -> Optional[Sink]:
    """Replace the sink; returns the previous one (the observer restores it when it stops)."""
    global _sink
    previous, _sink = _sink, sink
    return previous
