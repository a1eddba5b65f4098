"""Transfer, sync and per-operator counters kept by the C++ backend, as a JSON-able dict.

Counts are per call and come from the kernels themselves (never from warnings, which fire once
per operator). ``fixed`` counts calls served by a dmlpatch fix (:mod:`dmlpatch.opfix`);
``copies`` gives, per operator, the host<->device copies its calls cost on DirectML (its CPU
fallback copies arguments out and results back; the simulator itself copies nothing, so these
appear in ``transfers`` only when they really happen, as for ``DMLPATCH_CPU_OPS``).

The backend reports the first call of each fallback operator (and, with ``DMLPATCH_TRACE=1``,
of each refused or fixed one) through ``dmlpatch_sim::_notify``; the hook below issues
DirectML's warning as a Python UserWarning and records the Python stack of that call.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
import warnings
from typing import Any, Optional

import torch

from dmlpatch.environment_variables import DMLPATCH_TRACE

_first_calls: dict[str, str] = {}
_first_calls_lock = threading.Lock()
_hook_library: Optional[torch.library.Library] = None

# Frames of the hook's own dispatch, dropped from the end of recorded stacks.
_INTERNAL = (
    os.sep + os.path.join("torch", "_ops.py"),
    os.sep + os.path.join("torch", "library.py"),
    os.sep + os.path.join("torch", "_library") + os.sep,
    __file__,
)


def trace_requested() -> bool:
    return os.environ.get(DMLPATCH_TRACE, "") == "1"


def fallback_warning(name: str) -> str:
    """torch-directml's CPU-fallback warning, verbatim (from its 0.2.5 native library)."""
    return (
        f"The operator '{name}' is not currently supported on the DML backend and will fall "
        "back to run on the CPU. This may have performance implications."
    )


_PROGRAM_TEXT = frozenset({"<string>", "<stdin>"})


def _internal(filename: str) -> bool:
    return any(part in filename for part in _INTERNAL)


def _notify(anchor: torch.Tensor, name: str, warn: bool, trace: str) -> None:
    if warn:
        from dmlpatch.placement import frames

        # Attribute the warning to the program's (or its library's) line: the first frame
        # outside torch and dmlpatch (whose dispatch modes and fixes may be in between).
        # On autograd's worker threads there may be no Python caller at all.
        level, frame = 1, sys._getframe(0).f_back
        # Code given to python -c, exec() or stdin is the program's, though frames.internal
        # counts every made-up file name as nobody's line.
        while frame is not None and not _programs(frame, frames):
            level, frame = level + 1, frame.f_back
        if frame is not None:
            warnings.warn(fallback_warning(name), UserWarning, stacklevel=level + 1)
        else:
            # DirectML's own fallback warns once per operator: it names the forward line where
            # the program records forward stacks, else the backward() line.
            from dmlpatch.placement import backward_lines

            line = backward_lines.forward_line(torch._C._current_autograd_node())
            if line is not None:
                backward_lines.warn_at(fallback_warning(name), line)
            else:
                backward_lines.warn_at_backward(fallback_warning(name))
    if trace:
        stack = traceback.extract_stack()
        while stack and _internal(stack[-1].filename):
            stack.pop()
        formatted = "".join(traceback.format_list(stack))
        if not any(_programs_file(entry.filename) for entry in stack):
            # Autograd's device thread: the forward's stack, where it was recorded (check).
            from dmlpatch.placement import backward_lines

            formatted = backward_lines.forward_stack(torch._C._current_autograd_node()) or formatted
        with _first_calls_lock:
            _first_calls.setdefault(name, formatted)


def _programs_file(filename: str) -> bool:
    from dmlpatch.placement import frames

    return filename in _PROGRAM_TEXT or not frames.internal(filename)


def _programs(frame: Any, frames: Any) -> bool:
    """A frame of the program (or of its library): neither torch's nor dmlpatch's."""
    filename = frame.f_code.co_filename
    return filename in _PROGRAM_TEXT or not frames.internal(filename)


def install_hook() -> None:
    """Implement ``dmlpatch_sim::_notify`` (once per process)."""
    global _hook_library
    if _hook_library is None:
        library = torch.library.Library("dmlpatch_sim", "IMPL")
        library.impl("_notify", _notify, "CPU")
        _hook_library = library


def snapshot() -> dict[str, Any]:
    """Counters since the last reset (see :func:`dmlpatch.sim.counters`)."""
    transfers: dict[str, dict[str, int]] = {}
    syncs = 0
    ops: dict[str, dict[str, int]] = {"native": {}, "fixed": {}, "fallback": {}, "refused": {}}
    copies: dict[str, dict[str, int]] = {}
    for line in torch.ops.dmlpatch_sim.counters().splitlines():
        fields = line.split("\t")
        if fields[0] == "transfer":
            transfers[fields[1]] = {"count": int(fields[2]), "bytes": int(fields[3])}
        elif fields[0] == "syncs":
            syncs = int(fields[1])
        elif fields[0] == "copies":
            copies[fields[1]] = {"count": int(fields[2]), "bytes": int(fields[3])}
        else:
            table = ops[fields[0]]
            table[fields[1]] = table.get(fields[1], 0) + int(fields[2])
    with _first_calls_lock:
        first_calls = dict(_first_calls)
    return {
        "transfers": transfers,
        "syncs": syncs,
        "ops": ops,
        "copies": copies,
        "first_calls": first_calls,
    }


def reset() -> None:
    torch.ops.dmlpatch_sim.reset_counters()
    with _first_calls_lock:
        _first_calls.clear()


def costs() -> dict[str, dict[str, Any]]:
    """Per operator, what the cost model reads (``dmlpatch_sim::costs``): ``bytes`` and
    ``flops`` of its device kernels, ``readbacks`` (values the host waited for) and their
    bytes, ``upload_bytes`` (a fallback's copies back to the device), ``cpu_ns`` (a fallback's
    CPU kernel, timed) and ``compute_ps``, its kernels' roofline time on each configured
    adapter model, in the order they were configured."""
    table: dict[str, dict[str, Any]] = {}
    for line in torch.ops.dmlpatch_sim.costs().splitlines():
        fields = line.split("\t")
        name, numbers = fields[0], [int(field) for field in fields[1:]]
        table[name] = {
            "bytes": numbers[0],
            "flops": numbers[1],
            "readbacks": numbers[2],
            "readback_bytes": numbers[3],
            "upload_bytes": numbers[4],
            "cpu_ns": numbers[5],
            "compute_ps": numbers[6:],
        }
    return table
