"""``dmlpatch check``: run a program on DirectML (or the simulated device) and say whether it
would run there, and at what cost.

dmlpatch check [--device sim|dml] [--profile NAME] [--json FILE] [--html DIR] [--verify]
    script.py [args...]
dmlpatch check [options] -m module [args...]

The program runs with patches active. Afterwards a table lists every operator that was fixed
on the device, fell back to the CPU or was refused, with its calls, the host<->device copies
and bytes they cost, and where it was first called in the program's or a library's code; a
one-line verdict follows. Where model compute ran (:mod:`dmlpatch.placement`) is counted for
every heavy operator; when 10% or more of it ran on the CPU, the verdict names the lines and the
likely cause. Exit status: 0 when the program would run, 1 when DirectML would stop it (or
``--verify`` found a divergence, or a significant share of model compute ran on the CPU),
otherwise the program's own status.

Counts come from the simulated device's backend (``--device sim``, the default) or, on real
DirectML, from the dispatch-level observer (:mod:`dmlpatch.opfix.observer`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from dmlpatch import changes, log
from dmlpatch.environment_variables import DMLPATCH_DISABLE, DMLPATCH_SIM_PROFILE, DMLPATCH_TRACE
from dmlpatch.errors import UsageError
from dmlpatch.gaps.profiles import DEFAULT_PROFILE

if TYPE_CHECKING:
    from dmlpatch.report_types import Compute, Modelled

USAGE = f"""\
usage: dmlpatch check [--device sim|dml] [--profile NAME] [--json FILE] [--html DIR]
                      [--verify] script.py [args...]
       dmlpatch check [options] -m module [args...]

options:
  --device sim|dml  the simulated DirectML device (default) or a real DirectML adapter
  --profile NAME    the simulated device's DirectML release (default {DEFAULT_PROFILE})
  --json FILE       also write the table and verdict as JSON (for CI)
  --html DIR        also write DIR/index.html: the program's lines marked by where their
                    compute ran (made if missing)
  --verify          run every device operator on the CPU too; report the first that differs
  --scope SCOPE     where CUDA sites are rewritten: all (default), project, specs
  --report[=FILE]   at exit, print (or write) dmlpatch's JSON report, as the runner does
  -v, --verbose     say what is patched

exit status: 0 when the program would run on DirectML; 1 when DirectML would stop it,
--verify found a divergence, or 10% or more of model compute ran on the CPU; 2 for a bad
option, or when the --json FILE or the --html page could not be written at the end;
otherwise the program's own status.
"""

_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.*)$')
_HOW_ORDER = {"refused": 0, "fallback": 1, "fixed": 2}


class Row(NamedTuple):
    op: str
    how: str  # fixed | fallback | refused
    calls: int
    copies: int
    bytes: int
    first_call: Optional[str]  # file:line
    known_failure: Optional[str] = None  # its entry in dmlpatch.gaps.catalogue


class Outcome(NamedTuple):
    exit_code: int
    status: str  # runs | fails | diverges | error | cpu | interrupted
    verdict: str
    #: The catalogue entry of the failure that stopped the program (dmlpatch.gaps.catalogue).
    known_failure: Optional[str] = None


def main(arguments: list[str]) -> int:
    """The ``dmlpatch check`` command: the runner's path (``launch.run_program``) with a
    :class:`_Judge` that counts while the program runs and gives the verdict after."""
    from dmlpatch.startup import launch

    options = launch.parse_options(arguments, launch.CHECK_OPTIONS, command="dmlpatch check")
    if options.help:
        sys.stdout.write(USAGE)
        return 0
    device = options.device or "sim"
    if device not in ("sim", "dml") and not re.match(r"^(sim|dml):\d+$", device):
        raise UsageError(f"dmlpatch check runs on sim or dml, not {device!r}")
    if options.profile is not None and not device.startswith("sim"):
        raise UsageError("--profile chooses a simulated DirectML release; it needs --device sim")
    options.device = device
    if options.module is None and not options.rest:
        raise UsageError("dmlpatch check needs a program: dmlpatch check script.py [args...]")
    if options.json:
        from dmlpatch import report

        report.check_destination(options.json)
    if options.html:
        from dmlpatch.placement_page import destination

        destination.check_directory(options.html)
    if options.profile is not None:
        from dmlpatch.gaps import profiles

        profiles.resolve(options.profile)  # one-line error for an unknown name
        changes.set_environment(DMLPATCH_SIM_PROFILE, options.profile)
    changes.set_environment(DMLPATCH_TRACE, "1")  # first-call stacks from the simulated device

    os.environ.pop(DMLPATCH_DISABLE, None)
    from dmlpatch.placement import session

    session.by_operators()
    return launch.run_program(options, console_script=False, judge=_Judge(options))


class _Judge:
    """Counts what the program runs (operators, copies, placement), then says whether it would
    run on DirectML: the table, the verdict and ``--json``."""

    def __init__(self, options: Any) -> None:
        self.options = options

    def begin(self) -> None:
        from dmlpatch.devices import resolution
        from dmlpatch.placement import operators

        self.selected = resolution.current()
        import torch

        # Backward operators are named at the forward line that made them: autograd records
        # each node's forward stack (anomaly mode, without its NaN checks) while check runs.
        self.recording = not torch.is_anomaly_enabled()
        if self.recording:
            torch.set_anomaly_enabled(True, False)
        self.profile, self.observer, self.shadow = _start(
            self.selected.backend, self.options.verify
        )
        self.placement = operators.Counter(
            _serving(self.selected.backend, self.profile, self.observer)
        )
        if self.options.html:
            self.placement.ledger.keep_lines()
        self.tracing = operators.traces_unobserved()
        self.placement.__enter__()
        self.tracing.__enter__()

    def end(self, error: Optional[BaseException], code: int) -> int:
        for context in (self.tracing, self.placement, self.shadow, self.observer):
            if context is not None:
                context.__exit__(None, None, None)
        if self.recording:
            import torch

            torch.set_anomaly_enabled(False)
        counters = self.observer.snapshot() if self.observer is not None else _sim_counters()
        rows = table_rows(counters, _first_line(error))
        from dmlpatch.placement import summary

        compute = summary.compute(self.placement.ledger, self.selected.device, self.selected.type)
        _fallbacks_as_counted(compute, rows)
        divergence = self.shadow.divergence if self.shadow is not None else None
        outcome = judge(rows, counters, error, code if error is None else 0, divergence, compute)
        backend = self.selected.backend
        _print(rows, outcome, backend, self.profile, divergence, counters, compute)
        if self.options.json and not _write_json(
            self.options.json, rows, outcome, backend, self.profile, counters, divergence, compute
        ):
            return UsageError.exit_code  # what was asked for is missing: a CI must not read on
        if self.options.html and not _write_html(
            self.options, rows, outcome, self.selected.device, compute
        ):
            return UsageError.exit_code
        return outcome.exit_code


def _start(backend: str, verify: bool) -> tuple[Optional[str], Any, Any]:
    observer = shadow = None
    if backend == "sim":
        from dmlpatch import sim

        profile: Optional[str] = sim.profile()
        sim.reset_counters()
        from dmlpatch.costs import steps

        steps.restart()
    else:
        from dmlpatch._metadata import version_of
        from dmlpatch.gaps import profiles

        profile = profiles.profile_for_release(version_of("torch-directml"))
        from dmlpatch.opfix.observer import Observer

        observer = Observer(profile or profiles.DEFAULT_PROFILE)
        observer.__enter__()
    if verify:
        from dmlpatch.opfix.shadow import Shadow

        shadow = Shadow()
        shadow.__enter__()
    return profile, observer, shadow


def _serving(backend: str, profile: Optional[str], observer: Any) -> Any:
    """How the backend serves each operator, for counting what its CPU fallback ran."""
    if observer is not None:
        return observer.serving
    from dmlpatch.opfix import serving

    return serving.for_backend(backend, profile)


def _sim_counters() -> dict[str, Any]:
    from dmlpatch import sim

    return sim.counters()


# ---- the table ----


def first_frame(stack: str) -> Optional[str]:
    """``file:line`` of the innermost frame in the program's or a library's code (not torch,
    not dmlpatch), from a formatted stack; paths under the working directory are relative."""
    from dmlpatch.placement import frames

    found = None
    for line in stack.splitlines():
        match = _FRAME.match(line)
        if match is None:
            continue
        path = match.group("file")
        if frames.internal(path):
            continue
        found = f"{frames.display(path)}:{match.group('line')}"
    return found


def _fallbacks_as_counted(compute: Compute, rows: list[Row]) -> None:
    """The fallbacks the headline names are the table's: the backend counts every call that
    reaches the device, so its calls, copies and bytes are the one count. The operator counter
    adds what only it knows (the work, the line, the time); a fallback it never saw (run in a
    thread of the program's own, outside its dispatch mode) is named with no estimate."""
    named = {entry["operator"]: entry for entry in compute["cpu_fallbacks"]}
    for row in rows:
        if row.how != "fallback":
            continue
        entry = named.get(row.op)
        if entry is None:
            compute["cpu_fallbacks"].append(
                {
                    "operator": row.op,
                    "flops": 0,
                    "estimated_by": None,
                    "seconds": 0.0,
                    "at": row.first_call,
                    "calls": row.calls,
                    "copies": row.copies,
                    "bytes": row.bytes,
                }
            )
        else:
            entry["calls"], entry["copies"], entry["bytes"] = row.calls, row.copies, row.bytes


def _first_line(error: Optional[BaseException]) -> Optional[str]:
    if error is None or not str(error):
        return None
    return str(error).splitlines()[0]


def table_rows(counters: dict[str, Any], error: Optional[str] = None) -> list[Row]:
    """Fixed, fallback and refused operators, refusals first, each with the known failure it
    is (``error``: the first line of the exception that stopped the program, if any)."""
    from dmlpatch.gaps import catalogue

    rows = []
    firsts = counters.get("first_calls", {})
    copies = counters.get("copies", {})
    for how in ("refused", "fallback", "fixed"):
        for op, calls in counters["ops"].get(how, {}).items():
            cost = copies.get(op, {"count": 0, "bytes": 0}) if how == "fallback" else None
            where = first_frame(firsts[op]) if op in firsts else None
            rows.append(
                Row(
                    op,
                    how,
                    calls,
                    cost["count"] if cost else 0,
                    cost["bytes"] if cost else 0,
                    where,
                    _known(catalogue.for_gap(op, how, error if how == "refused" else None)),
                )
            )
    return sorted(rows, key=lambda r: (_HOW_ORDER[r.how], r.op))


def _known(failures: tuple[Any, ...]) -> Optional[str]:
    return "/".join(failure.key for failure in failures) or None


def judge(
    rows: list[Row],
    counters: dict[str, Any],
    error: Optional[BaseException],
    program_code: int,
    divergence: Any,
    compute: Optional[Compute] = None,
) -> Outcome:
    """The exit status and the one-line verdict."""
    refused = [r for r in rows if r.how == "refused"]
    if error is not None and refused:
        first = _first_refused(refused, counters)
        where = f" at {first.first_call}" if first.first_call else ""
        known = ""
        if first.known_failure:
            from dmlpatch.gaps import catalogue

            entry = catalogue.get(first.known_failure.split("/")[0])
            known = f" (known failure {first.known_failure}; {entry.fix}: {entry.remedy})"
        return Outcome(1, "fails", f"would fail: {first.op}{where}{known}", first.known_failure)
    if divergence is not None:
        frame = first_frame("".join(traceback.format_list(list(divergence.stack))))
        at = f" at {frame}" if frame else ""
        return Outcome(
            1,
            "diverges",
            f"diverges from the CPU: {divergence.op}{at} ({divergence.detail})",
        )
    if isinstance(error, KeyboardInterrupt):
        return Outcome(
            130,
            "interrupted",
            "interrupted (Ctrl-C) before the program finished: the table "
            "covers what ran until then",
        )
    if error is not None:
        message = str(error).splitlines()[0] if str(error) else ""
        reason = f"{type(error).__name__}: {message}" if message else type(error).__name__
        from dmlpatch.rewriting import missed

        reached = missed.explain(error)
        if reached is not None:
            return Outcome(1, "fails", f"would fail: {reason}; {reached}")
        from dmlpatch.gaps import catalogue

        failure = catalogue.for_error(reason)
        if failure is not None:
            return Outcome(
                1,
                "fails",
                f"would fail: {reason} (known failure {failure.key}; {failure.fix}: "
                f"{failure.remedy})",
                failure.key,
            )
        return Outcome(1, "error", f"the program failed for another reason: {reason}")
    on_cpu = _on_cpu(compute)
    if on_cpu is not None:
        code = program_code or 1
        return Outcome(code, "cpu", on_cpu)
    from dmlpatch.placement.summary import bytes_text

    fallbacks = [r for r in rows if r.how == "fallback"]
    fixed = [r for r in rows if r.how == "fixed"]
    copies = sum(r.copies for r in fallbacks)
    moved = sum(r.bytes for r in fallbacks)
    plural = "" if len(fallbacks) == 1 else "s"
    verdict = (
        f"runs on DirectML with {len(fallbacks)} fallback{plural} costing {copies} copies "
        f"({bytes_text(moved)}) per run"
    )
    if fixed:
        verdict += f"; {len(fixed)} operator{'' if len(fixed) == 1 else 's'} fixed on the device"
    if program_code != 0:
        return Outcome(program_code, "error", verdict + f"; the program exited with {program_code}")
    return Outcome(0, "runs", verdict)


def _on_cpu(compute: Optional[Compute]) -> Optional[str]:
    """The verdict when a significant share of model compute ran on the CPU, else None."""
    from dmlpatch.placement import summary

    if compute is None:
        return None
    share = summary.layers_cpu_share(compute)
    if share is None or share < summary.SIGNIFICANT_CPU_SHARE:
        return None
    verdict = f"does not run on DirectML: {summary.headline(compute)}"
    if compute["cpu_lines"]:
        verdict += f", most at {compute['cpu_lines'][0]['display']}"
    cause = compute["likely_cause"]
    if cause:
        verdict += f"; likely cause: {cause['text']}"
    return verdict


def _first_refused(refused: list[Row], counters: dict[str, Any]) -> Row:
    """The refusal recorded first (first_calls keeps the order calls happened in)."""
    order = list(counters.get("first_calls", {}))
    return min(refused, key=lambda r: order.index(r.op) if r.op in order else len(order))


def _print(
    rows: list[Row],
    outcome: Outcome,
    backend: str,
    profile: Optional[str],
    divergence: Any,
    counters: dict[str, Any],
    compute: Compute,
) -> None:
    out = sys.stderr
    where = "simulated DirectML" if backend == "sim" else "DirectML"
    out.write(f"dmlpatch check: {where}" + (f", profile {profile}" if profile else "") + "\n")
    out.write(f"installed: {installed_line()}\n")
    from dmlpatch.placement import summary

    out.write(f"model compute: {summary.headline(compute)}\n")
    for line in summary.explain(compute):
        out.write(line + "\n")
    if backend == "sim":
        from dmlpatch.costs import simulated

        for line in simulated.describe(simulated.section()):
            out.write(line + "\n")
    precision = _precision_line()
    if precision:
        out.write(precision + "\n")
    if rows:
        header = ("operator", "how", "calls", "copies", "bytes", "first called at", "known as")
        table = [header] + [
            (
                r.op,
                r.how,
                str(r.calls),
                str(r.copies) if r.how == "fallback" else "-",
                str(r.bytes) if r.how == "fallback" else "-",
                r.first_call or "?",
                r.known_failure or "-",
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            cells = [
                cell.rjust(widths[i]) if 2 <= i <= 4 else cell.ljust(widths[i])
                for i, cell in enumerate(row)
            ]
            out.write("  " + "  ".join(cells).rstrip() + "\n")
    elif sum(counters["ops"].get("native", {}).values()):
        out.write("  every operator ran natively\n")
    else:
        out.write("  no operator ran on the device\n")
    if divergence is not None:
        out.write(f"first divergence: {divergence.op}: {divergence.detail}\n")
        from dmlpatch.placement import frames

        shown = [f for f in divergence.stack if not frames.internal(f.filename)]
        out.write("".join(traceback.format_list(shown[-6:])))
    out.write(f"verdict: {outcome.verdict}\n")
    out.flush()


def _precision_line() -> str:
    """What autocast ran in which precision on the device, where the program used it."""
    from dmlpatch import report

    calls = report.autocast_calls()
    if not calls:
        return ""
    by_dtype = ", ".join(f"{count:,} in {dtype}" for dtype, count in sorted(calls.items()))
    return (
        f"mixed precision: {sum(calls.values()):,} operator calls under autocast ran by CUDA's "
        f"lists: {by_dtype}; every other operator in the dtype it was given"
    )


def installed_line() -> str:
    """What dmlpatch changed in the process, by kind (the ledger; ``--json`` lists each)."""
    entries = changes.entries()
    kinds: dict[str, int] = {}
    for entry in entries:
        kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
    by_kind = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
    kept = sum(1 for entry in entries if entry.undo is None)
    return (
        f"{len(entries)} changes to this process ({by_kind}); "
        f"{kept} of them cannot be undone by dmlpatch.unpatch()"
    )


def _write_json(
    destination: str,
    rows: list[Row],
    outcome: Outcome,
    backend: str,
    profile: Optional[str],
    counters: dict[str, Any],
    divergence: Any,
    compute: Compute,
) -> bool:
    """Whether the JSON was written (a failure is said in one line)."""
    from dmlpatch import report

    data = {
        "backend": backend,
        "profile": profile,
        "ops": [r._asdict() for r in rows],
        "transfers": report.transfers(counters) if backend == "sim" else None,
        "compute": compute,
        "status": outcome.status,
        "known_failure": outcome.known_failure,
        "exit_code": outcome.exit_code,
        "verdict": outcome.verdict,
        "installed": changes.listing(),
        "modelled": _modelled(backend),
        "autocast": report.autocast_calls(),
        "divergence": None
        if divergence is None
        else {
            "op": divergence.op,
            "detail": divergence.detail,
            "at": first_frame("".join(traceback.format_list(list(divergence.stack)))),
        },
    }
    try:
        with open(destination, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
    except OSError as error:
        log.say(f"error: cannot write {destination}: {error.strerror}")
        return False
    return True


def _modelled(backend: str) -> Optional[Modelled]:
    if backend != "sim":
        return None
    from dmlpatch.costs import simulated

    return simulated.section()


def _write_html(
    options: Any, rows: list[Row], outcome: Outcome, device: str, compute: Compute
) -> bool:
    """Whether the page was written (a failure is said in one line)."""
    import shlex

    from dmlpatch.placement_page import destination, page

    program = shlex.join(["-m", options.module, *options.rest] if options.module else options.rest)
    report = page.Report(
        program, device, outcome.verdict, compute, [r._asdict() for r in rows], page.BY_CHECK
    )
    try:
        written = destination.write_directory(options.html, report)
    except OSError as error:
        log.say(f"error: cannot write the page in {options.html}: {error.strerror or error}")
        return False
    log.say(f"placement page: {written}")
    return True
