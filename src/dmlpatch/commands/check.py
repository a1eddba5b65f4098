"""``dmlpatch check``: run a program on DirectML (or the simulated device) and say whether it
would run there, and at what cost.

dmlpatch check [--device sim|dml] [--profile NAME] [--json FILE] [--verify] script.py [args...]
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
from typing import Any, NamedTuple, Optional

from dmlpatch import log
from dmlpatch.errors import UsageError

USAGE = """\
usage: dmlpatch check [--device sim|dml] [--profile NAME] [--json FILE] [--verify]
                      script.py [args...]
       dmlpatch check [options] -m module [args...]

options:
  --device sim|dml  the simulated DirectML device (default) or a real DirectML adapter
  --profile NAME    the simulated device's DirectML release (default torch-directml-0.2.5)
  --json FILE       also write the table and verdict as JSON (for CI)
  --verify          run every device operator on the CPU too; report the first that differs
  --scope SCOPE     where CUDA sites are rewritten: all (default), project, specs
  -v, --verbose     say what is patched

exit status: 0 when the program would run on DirectML; 1 when DirectML would stop it,
--verify found a divergence, or 10% or more of model compute ran on the CPU; 2 for a bad
option, or when the --json FILE could not be written at the end; otherwise the program's own
status.
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
    status: str  # runs | fails | diverges | error | cpu
    verdict: str
    #: The catalogue entry of the failure that stopped the program (dmlpatch.gaps.catalogue).
    known_failure: Optional[str] = None


class _Options(NamedTuple):
    device: str
    profile: Optional[str]
    json: Optional[str]
    verify: bool
    rest: list[str]


def _parse(arguments: list[str]) -> _Options:
    device, profile, destination, verify = "sim", None, None, False
    passed: list[str] = []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        name, eq, value = argument.partition("=")
        if name in ("--device", "-d", "--profile", "--json"):
            if not eq:
                if index + 1 >= len(arguments):
                    raise UsageError(f"{name} needs a value; see dmlpatch check --help")
                value = arguments[index + 1]
                index += 1
            if name == "--profile":
                profile = value
            elif name == "--json":
                destination = value
            else:
                device = value
            index += 1
        elif argument == "--verify":
            verify = True
            index += 1
        elif argument in ("-v", "--verbose") or argument.startswith("--scope="):
            passed.append(argument)
            index += 1
        elif argument == "--scope":
            passed.extend(arguments[index : index + 2])
            index += 2
        else:
            break
    if device not in ("sim", "dml") and not re.match(r"^(sim|dml):\d+$", device):
        raise UsageError(f"dmlpatch check runs on sim or dml, not {device!r}")
    if profile is not None and not device.startswith("sim"):
        raise UsageError("--profile chooses a simulated DirectML release; it needs --device sim")
    return _Options(device, profile, destination, verify, passed + arguments[index:])


def main(arguments: list[str]) -> int:
    """The ``dmlpatch check`` command."""
    if arguments[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    from dmlpatch.startup import launch, runner

    chosen = _parse(arguments)
    options = launch.parse_options(chosen.rest)
    options.device = chosen.device
    if options.module is None and not options.rest:
        raise UsageError("dmlpatch check needs a program: dmlpatch check script.py [args...]")
    if options.module is not None:
        runner.check_module(options.module)
    else:
        runner.check_path(options.rest[0])
    if chosen.json:
        from dmlpatch import report

        report.check_destination(chosen.json)
    if chosen.profile is not None:
        from dmlpatch.gaps import profiles

        profiles.resolve(chosen.profile)  # one-line error for an unknown name
        os.environ[profiles.PROFILE_ENV] = chosen.profile
    os.environ["DMLPATCH_TRACE"] = "1"  # first-call stacks from the simulated device
    from dmlpatch.patching import engine

    os.environ.pop(engine.DISABLE_VAR, None)
    from dmlpatch.placement import session

    session.by_operators()
    launch.prepare(options)
    return _check(options, chosen)


def _check(options: Any, chosen: _Options) -> int:
    from dmlpatch.devices import resolution
    from dmlpatch.startup import runner

    selected = resolution.current()
    backend = selected.backend
    profile, observer, shadow = _start(backend, chosen.verify)
    from dmlpatch.placement import operators

    placement = operators.Counter(_serving(backend, profile, observer))
    placement.__enter__()
    tracing = operators.traces_unobserved()
    tracing.__enter__()
    error: Optional[BaseException] = None
    program_code = 0
    program_file = None if options.module else os.path.abspath(options.rest[0])
    try:
        if options.module is not None:
            runner.run_module(options.module, options.rest, rewrite=True)
        else:
            runner.run_path(options.rest[0], options.rest[1:], rewrite=True)
    except SystemExit as exit_:
        program_code = runner.exit_status(exit_.code)
    except BaseException as caught:  # the program's own failure: reported, then judged
        error = caught
    finally:
        tracing.__exit__(None, None, None)
        placement.__exit__(None, None, None)
        if shadow is not None:
            shadow.__exit__(None, None, None)
        if observer is not None:
            observer.__exit__(None, None, None)
    counters = observer.snapshot() if observer is not None else _sim_counters()
    rows = table_rows(counters, _first_line(error))
    from dmlpatch.placement import summary

    compute = summary.compute(placement.ledger, selected.device, selected.type)
    if error is not None and not isinstance(error, KeyboardInterrupt):
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        trimmed = runner.program_traceback(error, program_file or main_file)
        sys.excepthook(type(error), error.with_traceback(trimmed), trimmed)
    divergence = shadow.divergence if shadow is not None else None
    outcome = judge(rows, counters, error, program_code, divergence, compute)
    _print(rows, outcome, backend, profile, divergence, counters, compute)
    if chosen.json and not _write_json(
        chosen.json, rows, outcome, backend, profile, counters, divergence, compute
    ):
        return UsageError.exit_code  # what was asked for is missing: a CI must not read on
    return outcome.exit_code


def _start(backend: str, verify: bool) -> tuple[Optional[str], Any, Any]:
    observer = shadow = None
    if backend == "sim":
        from dmlpatch import sim

        profile: Optional[str] = sim.profile()
        sim.reset_counters()
    else:
        from dmlpatch import opfix
        from dmlpatch._metadata import version_of

        profile = opfix.profile_for_release(version_of("torch-directml"))
        from dmlpatch.opfix.observer import Observer

        observer = Observer(profile or "torch-directml-0.2.5")
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


def _size(nbytes: int) -> str:
    """``512 B``, ``1.5 KB`` ... ``2048.0 GB``: decimal units, as the copies' byte counts."""
    if nbytes < 1000:
        return f"{nbytes} B"
    scaled = float(nbytes)
    for unit in ("KB", "MB", "GB"):
        scaled /= 1000
        if round(scaled, 1) < 1000 or unit == "GB":
            break
    return f"{scaled:.1f} {unit}"


def judge(
    rows: list[Row],
    counters: dict[str, Any],
    error: Optional[BaseException],
    program_code: int,
    divergence: Any,
    compute: Optional[dict[str, Any]] = None,
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
        where = first_frame("".join(traceback.format_list(list(divergence.stack))))
        at = f" at {where}" if where else ""
        return Outcome(
            1,
            "diverges",
            f"diverges from the CPU: {divergence.op}{at} ({divergence.detail})",
        )
    if error is not None:
        message = str(error).splitlines()[0] if str(error) else ""
        reason = f"{type(error).__name__}: {message}" if message else type(error).__name__
        from dmlpatch.gaps import catalogue

        known = catalogue.for_error(reason)
        if known is not None:
            return Outcome(
                1,
                "fails",
                f"would fail: {reason} (known failure {known.key}; {known.fix}: {known.remedy})",
                known.key,
            )
        return Outcome(1, "error", f"the program failed for another reason: {reason}")
    on_cpu = _on_cpu(compute)
    if on_cpu is not None:
        code = program_code or 1
        return Outcome(code, "cpu", on_cpu)
    fallbacks = [r for r in rows if r.how == "fallback"]
    fixed = [r for r in rows if r.how == "fixed"]
    copies = sum(r.copies for r in fallbacks)
    moved = sum(r.bytes for r in fallbacks)
    plural = "" if len(fallbacks) == 1 else "s"
    verdict = (
        f"runs on DirectML with {len(fallbacks)} fallback{plural} costing {copies} copies "
        f"({_size(moved)}) per run"
    )
    if fixed:
        verdict += f"; {len(fixed)} operator{'' if len(fixed) == 1 else 's'} fixed on the device"
    if program_code != 0:
        return Outcome(program_code, "error", verdict + f"; the program exited with {program_code}")
    return Outcome(0, "runs", verdict)


def _on_cpu(compute: Optional[dict[str, Any]]) -> Optional[str]:
    """The verdict when a significant share of model compute ran on the CPU, else None."""
    from dmlpatch.placement import summary

    if compute is None:
        return None
    share = summary.cpu_share(compute)
    if share is None or share < summary.SIGNIFICANT_CPU_SHARE:
        return None
    verdict = f"does not run on DirectML: {summary.headline(compute)}"
    if compute["cpu_lines"]:
        verdict += f", most at {compute['cpu_lines'][0]['display']}"
    cause = compute.get("likely_cause")
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
    compute: dict[str, Any],
) -> None:
    out = sys.stderr
    where = "simulated DirectML" if backend == "sim" else "DirectML"
    out.write(f"dmlpatch check: {where}" + (f", profile {profile}" if profile else "") + "\n")
    from dmlpatch.placement import summary

    out.write(f"model compute: {summary.headline(compute)}\n")
    for line in summary.explain(compute):
        out.write(line + "\n")
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
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        for line in table:
            cells = [
                cell.rjust(widths[i]) if 2 <= i <= 4 else cell.ljust(widths[i])
                for i, cell in enumerate(line)
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


def _write_json(
    destination: str,
    rows: list[Row],
    outcome: Outcome,
    backend: str,
    profile: Optional[str],
    counters: dict[str, Any],
    divergence: Any,
    compute: dict[str, Any],
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
