"""The run's report: what dmlpatch did in this process (``dmlpatch.record``), the device it
chose, where compute ran and the device's counters, assembled as JSON-able data and written at
exit (``--report``)."""

from __future__ import annotations

import os
import sys

from dmlpatch import record
from dmlpatch.placement_page.destination import is_page

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from dmlpatch.report_types import Copies, Kept, Patch, Report, Rewritten, Transfers


def snapshot() -> Report:
    """The report as plain JSON-able data; never imports torch itself.

    ``device``/``backend``/``adapter``/``why``: what dmlpatch selected for the program's CUDA
    sites, the same in every entry point (resolved at exit when the program loaded torch but
    never asked; null, with ``why`` saying so, when it never imported torch); ``compute``:
    where model compute really ran; ``transfers``: the program's own copies, and the copies
    DirectML's CPU fallbacks make, counted by the simulated device (null elsewhere: only
    ``dmlpatch check`` counts on real DirectML); ``installed``: what dmlpatch changed in the
    process (:mod:`dmlpatch.changes`); ``modelled``: the simulated device's work priced on the
    adapter it models, per training step (:mod:`dmlpatch.costs`; null elsewhere); ``autocast``:
    the operator calls autocast ran on DirectML, by the dtype it ran them in (null: none).
    """
    from dmlpatch.placement import session

    resolution = session.selected()
    patches: dict[str, Patch] = {}
    rewritten: list[Rewritten] = []
    unrewritten: list[Kept] = []
    recorded = record.Entries()

    def spec_entry(name: str) -> Patch:
        return patches.setdefault(name, {"modules": [], "functions": [], "skipped": []})

    for entry in recorded.rewrites:
        by = {record.MAIN: "main script", record.DISCOVERED: record.DISCOVERED}.get(
            entry["spec"], "spec"
        )
        done: Rewritten = {
            "module": entry["module"],
            "sites": entry["sites"],
            "cached": entry["cached"],
            "by": by,
        }
        if by == "spec":
            done["spec"] = entry["spec"]
        rewritten.append(done)
        if entry["spec"] == record.DISCOVERED:
            continue
        spec = spec_entry(entry["spec"])
        spec["modules"].append(
            {"module": entry["module"], "sites": entry["sites"], "cached": entry["cached"]}
        )
    for entry in recorded.wraps:
        spec = spec_entry(entry["spec"])
        spec["functions"].append(entry["target"])
    for entry in recorded.aliases:
        spec = spec_entry(entry["spec"])
        spec.setdefault("aliases", []).append({"alias": entry["alias"], "module": entry["module"]})
    for entry in recorded.skipped:
        if entry["spec"] == record.DISCOVERED:
            unrewritten.append({"module": entry["module"], "reason": entry["reason"]})
            continue
        spec = spec_entry(entry["spec"])
        spec["skipped"].append({"module": entry["module"], "reason": entry["reason"]})
    from dmlpatch import changes

    data: Report = {
        "device": resolution.device if resolution else None,
        "backend": resolution.backend if resolution else None,
        "adapter": resolution.adapter if resolution else None,
        "why": resolution.why if resolution else _unselected(),
        "scope": _scope(),
        "patches": patches,
        "rewritten": rewritten,
        "kept_as_written": unrewritten,
        "compute": session.section(),
        "installed": changes.listing(),
        "ops": None,
        "transfers": None,
        "modelled": None,
        "autocast": autocast_calls(),
    }
    sim = sys.modules.get("dmlpatch.sim")
    if sim is not None and sim.is_loaded():
        counters = sim.counters()
        data["ops"] = counters.get("ops")
        data["transfers"] = transfers(counters)
        from dmlpatch.costs import simulated

        data["modelled"] = simulated.section()
    return data


def autocast_calls() -> Optional[dict[str, int]]:
    """The operator calls autocast ran on the DirectML device, by dtype; None where none did."""
    kernels = sys.modules.get("dmlpatch.opfix.precision.autocast")
    counted = kernels.calls() if kernels is not None else {}
    return counted or None


def transfers(counters: dict[str, Any]) -> Transfers:
    """The program's own host<->device copies beside those of DirectML's CPU fallbacks."""
    copies = counters.get("copies") or {}
    return {
        "program": _programs_own(counters.get("transfers") or {}),
        "fallback": {
            "count": sum(entry["count"] for entry in copies.values()),
            "bytes": sum(entry["bytes"] for entry in copies.values()),
            "by_operator": copies,
        },
        "syncs": counters["syncs"],
    }


def _programs_own(counted: dict[str, Copies]) -> dict[str, Copies]:
    """The simulated device's transfer counts less the copies dmlpatch's own CPU kernels made
    (``DMLPATCH_CPU_OPS``, counted fallbacks): those are the fallbacks', not the program's."""
    cpu_ops = sys.modules.get("dmlpatch.opfix.cpu_ops")
    if cpu_ops is None:
        return counted
    own: dict[str, Copies] = {key: {**value} for key, value in counted.items()}
    for direction, made in cpu_ops.copies_made().items():
        entry = own.get(direction)
        if entry is not None:
            entry["count"] = max(0, entry["count"] - made["count"])
            entry["bytes"] = max(0, entry["bytes"] - made["bytes"])
    return own


def _unselected() -> str:
    if "torch" not in sys.modules:
        return "the program never imported torch, so no device was selected"
    return "the device could not be resolved at exit"


def _scope() -> str:
    from dmlpatch.rewriting import scope

    return scope.configured_scope()


def check_destination(destination: str) -> None:
    """Fail before the program runs when the report could not be written at exit.

    Creates nothing: the file is written only at exit. ``-`` (stderr) is always fine.
    """
    if destination == "-":
        return
    from dmlpatch.errors import UsageError

    path = os.path.abspath(destination)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        raise UsageError(f"cannot write the report to {path!r}: it is a directory")
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write the report to {path!r}: no directory {parent!r}")
    target = path if os.path.exists(path) else parent
    if not os.access(target, os.W_OK):
        raise UsageError(f"cannot write the report to {path!r}: permission denied")


#: In a report path, replaced by the process's ``$RANK`` (DDP ranks), its index among the
#: processes ``torch.multiprocessing.spawn`` started, another child's name, or ``main``.
RANK_FIELD = "{rank}"


def per_process(destination: str) -> bool:
    """Whether every process of the job writes its own report (the path names ``{rank}``)."""
    return RANK_FIELD in destination


def write(destination: str) -> None:
    """Write the report as JSON to a file, or to stderr when ``destination`` is ``-``."""
    import json

    from dmlpatch import processes

    destination = destination.replace(RANK_FIELD, processes.rank())
    data = snapshot()
    if destination == "-":
        sys.stderr.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return
    try:
        if is_page(destination):
            _write_page(destination, data)
        else:
            with open(destination, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    except OSError as error:
        # At exit, after the program's status is set: python keeps it whatever an exit handler
        # does, so this is a warning, and the line says which status the process ends with.
        from dmlpatch import log

        log.say(
            f"warning: cannot write the report to {destination!r}: {error.strerror}; the exit "
            "code stays the program's"
        )


def _write_page(destination: str, data: Report) -> None:
    """The report as the placement page (a path ending in ``.html``)."""
    import shlex

    from dmlpatch.placement import summary
    from dmlpatch.placement_page import page

    compute = data["compute"]
    device = data["device"] or "no device"
    if compute:
        verdict = summary.exit_warning(compute, sys.argv) or summary.headline(compute)
    else:
        verdict = f"no model compute was counted ({data['why'] or 'nothing ran'})"
    program = shlex.join(sys.argv) if sys.argv and sys.argv[0] else "<program>"
    page.write(destination, page.Report(program, device, verdict, compute, [], page.BY_RUN))
