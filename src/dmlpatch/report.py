"""What dmlpatch did in this process: patches applied, device chosen, and device counters."""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

_lock = _thread.allocate_lock()
_rewrites: list[dict[str, Any]] = []
_wraps: list[dict[str, Any]] = []
_skipped: list[dict[str, Any]] = []
_aliases: list[dict[str, Any]] = []

#: The pseudo-spec names of what no patch spec named: the program's main script, and modules
#: rewritten (or left alone) by discovery.
#: Where a run's report goes (``--report=FILE`` sets it for the program's children).
REPORT_VAR = "DMLPATCH_REPORT"
MAIN = "__main__"
DISCOVERED = "discovered"


def record_rewrite(spec: str, module: str, sites: int, cached: bool) -> None:
    """A module was compiled with its CUDA sites rewritten (``cached``: from the bytecode cache)."""
    with _lock:
        _rewrites.append({"spec": spec, "module": module, "sites": sites, "cached": cached})


def record_wrap(spec: str, target: str) -> None:
    """A function-level fix was applied to ``target`` (``module:qualname``)."""
    with _lock:
        _wraps.append({"spec": spec, "target": target})


def record_unwrap(spec: str, target: str) -> None:
    with _lock:
        _wraps[:] = [w for w in _wraps if not (w["spec"] == spec and w["target"] == target)]


def record_alias(spec: str, alias: str, real: str) -> None:
    """A missing module was provided as an alias of its renamed successor."""
    with _lock:
        _aliases.append({"spec": spec, "alias": alias, "module": real})


def record_skip(spec: str, module: Optional[str], reason: str) -> None:
    """A spec or one of its modules was left untouched (stale, wrong version, imported early)."""
    with _lock:
        _skipped.append({"spec": spec, "module": module, "reason": reason})


def module_fates() -> tuple[set[str], dict[str, str]]:
    """The modules rewritten so far, and those left alone with the reason why."""
    with _lock:
        rewritten = {entry["module"] for entry in _rewrites}
        skipped = {e["module"]: e["reason"] for e in _skipped if e["module"] is not None}
    return rewritten, skipped


def snapshot() -> dict[str, Any]:
    """The report as plain JSON-able data; never imports torch itself.

    ``device``/``backend``/``adapter``/``why``: what dmlpatch selected for the program's CUDA
    sites, the same in every entry point (resolved at exit when the program loaded torch but
    never asked; null, with ``why`` saying so, when it never imported torch); ``compute``:
    where model compute really ran; ``transfers``: the program's own copies, and the copies
    DirectML's CPU fallbacks make, counted by the simulated device (null elsewhere: only
    ``dmlpatch check`` counts on real DirectML).
    """
    from dmlpatch.placement import session

    resolution = session.selected()
    patches: dict[str, dict[str, Any]] = {}
    rewritten: list[dict[str, Any]] = []
    unrewritten: list[dict[str, Any]] = []
    with _lock:
        for entry in _rewrites:
            by = {MAIN: "main script", DISCOVERED: DISCOVERED}.get(entry["spec"], "spec")
            rewritten.append(
                {
                    "module": entry["module"],
                    "sites": entry["sites"],
                    "cached": entry["cached"],
                    "by": by,
                    **({"spec": entry["spec"]} if by == "spec" else {}),
                }
            )
            if entry["spec"] == DISCOVERED:
                continue
            spec = patches.setdefault(
                entry["spec"], {"modules": [], "functions": [], "skipped": []}
            )
            spec["modules"].append(
                {"module": entry["module"], "sites": entry["sites"], "cached": entry["cached"]}
            )
        for entry in _wraps:
            spec = patches.setdefault(
                entry["spec"], {"modules": [], "functions": [], "skipped": []}
            )
            spec["functions"].append(entry["target"])
        for entry in _aliases:
            spec = patches.setdefault(
                entry["spec"], {"modules": [], "functions": [], "skipped": []}
            )
            spec.setdefault("aliases", []).append(
                {"alias": entry["alias"], "module": entry["module"]}
            )
        for entry in _skipped:
            if entry["spec"] == DISCOVERED:
                unrewritten.append({"module": entry["module"], "reason": entry["reason"]})
                continue
            spec = patches.setdefault(
                entry["spec"], {"modules": [], "functions": [], "skipped": []}
            )
            spec["skipped"].append({"module": entry["module"], "reason": entry["reason"]})
    data: dict[str, Any] = {
        "device": resolution.device if resolution else None,
        "backend": resolution.backend if resolution else None,
        "adapter": resolution.adapter if resolution else None,
        "why": resolution.why if resolution else _unselected(),
        "scope": _scope(),
        "patches": patches,
        "rewritten": rewritten,
        "kept_as_written": unrewritten,
    }
    data["compute"] = session.section()
    data["ops"] = data["transfers"] = None
    sim = sys.modules.get("dmlpatch.sim")
    if sim is not None and sim.is_loaded():
        counters = sim.counters()
        data["ops"] = counters.get("ops")
        data["transfers"] = transfers(counters)
    return data


def transfers(counters: dict[str, Any]) -> dict[str, Any]:
    """The program's own host<->device copies beside those of DirectML's CPU fallbacks."""
    copies = counters.get("copies") or {}
    return {
        "program": _programs_own(counters.get("transfers") or {}),
        "fallback": {
            "count": sum(entry["count"] for entry in copies.values()),
            "bytes": sum(entry["bytes"] for entry in copies.values()),
            "by_operator": copies,
        },
        "syncs": counters.get("syncs"),
    }


def _programs_own(counted: dict[str, Any]) -> dict[str, Any]:
    """The simulated device's transfer counts less the copies dmlpatch's own CPU kernels made
    (``DMLPATCH_CPU_OPS``, counted fallbacks): those are the fallbacks', not the program's."""
    cpu_ops = sys.modules.get("dmlpatch.opfix.cpu_ops")
    if cpu_ops is None:
        return counted
    own = {key: dict(value) for key, value in counted.items()}
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
    from dmlpatch.rewriting import discovery

    return discovery.configured_scope()


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


#: In a report path, replaced by the process's ``$RANK`` (DDP ranks) or ``main``.
RANK_FIELD = "{rank}"


def per_process(destination: str) -> bool:
    """Whether every process of the job writes its own report (the path names ``{rank}``)."""
    return RANK_FIELD in destination


def write(destination: str) -> None:
    """Write the report as JSON to a file, or to stderr when ``destination`` is ``-``."""
    import json

    destination = destination.replace(RANK_FIELD, os.environ.get("RANK") or "main")
    text = json.dumps(snapshot(), indent=2, sort_keys=True)
    if destination == "-":
        sys.stderr.write(text + "\n")
        return
    try:
        with open(destination, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    except OSError as error:
        # At exit, after the program's status is set: python keeps it whatever an exit handler
        # does, so this is a warning, and the line says which status the process ends with.
        from dmlpatch import log

        log.say(
            f"warning: cannot write the report to {destination!r}: {error.strerror}; the exit "
            "code stays the program's"
        )
