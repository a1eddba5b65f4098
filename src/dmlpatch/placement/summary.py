"""What the counts mean: the share of model compute that ran on the device, the CPU lines that
ran the rest, the likely cause, and the words for the report, ``check`` and the exit warning."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

from dmlpatch.placement import causes, families, ledger

if TYPE_CHECKING:
    from dmlpatch.report_types import Compute, CpuFallback, CpuLine, Line, LineFallback

#: ``dmlpatch check`` fails (exit 1) when at least this share of model compute ran on the CPU.
SIGNIFICANT_CPU_SHARE = 0.10
#: An ordinary run warns at exit when more than this share ran on the CPU.
MOST = 0.5
_TOP_LINES = 5


def flops_text(value: int) -> str:
    """``3.4 GFLOP``: an estimate's order of magnitude, as the report's words give it."""
    for unit, scale in (("TFLOP", 10**12), ("GFLOP", 10**9), ("MFLOP", 10**6), ("kFLOP", 10**3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} FLOP"


def compute(book: ledger.Ledger, device: str, device_type: str) -> Compute:
    """The report's ``compute`` section (JSON-able) for the selected ``device``."""
    device_calls, device_flops = book.totals(device_type)
    cpu_calls, cpu_flops = book.totals(ledger.CPU)
    loading_calls, loading_flops = book.totals(ledger.LOADING)
    building_calls, building_flops = book.totals(ledger.BUILDING)
    elsewhere_calls, elsewhere_flops = book.others(
        device_type, ledger.CPU, ledger.LOADING, ledger.BUILDING
    )
    sites = book.heaviest_cpu_sites()
    cpu_share = _share(cpu_calls, cpu_flops, device_calls, device_flops)
    lines: list[CpuLine] = [
        {
            "at": f"{site.file}:{site.line}" if site else None,
            "display": site.describe() if site else "(no Python caller: autograd's backward)",
            "function": site.function if site else None,
            "calls": entry["calls"],
            "flops": entry["flops"],
            "families": sorted(entry["families"]),
            "fallbacks": sorted(entry.get("fallbacks", ())),
        }
        for site, entry in sites[:_TOP_LINES]
    ]
    fallbacks: list[CpuFallback] = [
        {
            "operator": operator,
            "calls": tally["calls"],
            "flops": tally["flops"],
            "copies": tally.get("copies", 0),
            "bytes": tally.get("bytes", 0),
            "estimated_by": "elements" if tally.get("family") == families.OTHER else "flops",
            "at": tally["site"].describe() if tally["site"] else None,
            "seconds": round(tally.get("seconds", 0.0), 6),
        }
        for operator, tally in book.heaviest_fallbacks()
    ]
    other_calls = sum(e["calls"] for e in fallbacks if e["estimated_by"] == "elements")
    other_work = sum(e["flops"] for e in fallbacks if e["estimated_by"] == "elements")
    layers = _share(cpu_calls - other_calls, cpu_flops - other_work, device_calls, device_flops)
    cause = None
    if cpu_share is not None and cpu_share >= SIGNIFICANT_CPU_SHARE:
        by_fallback = sum(entry["flops"] for entry in fallbacks)
        if fallbacks and 2 * by_fallback >= cpu_flops:
            cause = causes.fallback(fallbacks[0]["operator"], fallbacks[0]["at"]).as_dict()
        else:
            files = [site.file for site, entry in sites if site is not None]
            cause = causes.likely(files, _main_file()).as_dict()
    section: Compute = {
        "counted": book.counted,
        "device": device,
        "on_device": {"calls": device_calls, "flops": device_flops},
        "on_cpu": {"calls": cpu_calls, "flops": cpu_flops},
        "data_loading_on_cpu": {"calls": loading_calls, "flops": loading_flops},
        "model_setup_on_cpu": {"calls": building_calls, "flops": building_flops},
        "elsewhere": {"calls": elsewhere_calls, "flops": elsewhere_flops},
        # None where no layer ran: fallbacks of other operators alone are no model to share.
        "device_share": None if layers is None or cpu_share is None else round(1.0 - cpu_share, 4),
        "cpu_lines": lines,
        "cpu_fallbacks": fallbacks,
        # Of on_cpu: fallbacks of operators outside the layer families, counted by elements.
        "other_fallback_work": {"calls": other_calls, "flops": other_work},
        "likely_cause": cause,
    }
    if book.keeps_lines:
        section["lines"] = [_line(site, parts) for site, parts in book.lines()]
    return section


def _line(site: Any, parts: dict[str, Any]) -> Line:
    """One source line's compute, by where it ran (the HTML report's marks)."""
    device = parts.get("device") or {}
    cpu = parts.get("cpu") or {}
    costs = cpu.get("fallback_costs") or {}
    through: list[LineFallback] = [
        {
            "operator": operator,
            "calls": cost["calls"],
            "flops": cost["flops"],
            "copies": cost["copies"],
            "bytes": cost["bytes"],
            "seconds": round(cost["seconds"], 6),
        }
        for operator, cost in sorted(costs.items(), key=lambda item: -item[1]["seconds"])
    ]
    return {
        "file": site.file,
        "line": site.line,
        "function": site.function,
        "device": {
            "calls": device.get("calls", 0),
            "flops": device.get("flops", 0),
            "families": sorted(device.get("families", ())),
        },
        "fixed": dict(sorted((device.get("fixed") or {}).items())),
        # Left on the CPU by the program: the line's CPU compute less its fallbacks'.
        "cpu": {
            "calls": cpu.get("calls", 0) - sum(cost["calls"] for cost in through),
            "flops": cpu.get("flops", 0) - sum(cost["flops"] for cost in through),
            "families": sorted(set(cpu.get("families", ())) - {families.OTHER}),
        },
        "fallbacks": through,
    }


def _share(cpu_calls: int, cpu_flops: int, device_calls: int, device_flops: int) -> Optional[float]:
    """The CPU's share of model compute (by FLOPs; by calls when no FLOPs were estimated)."""
    if cpu_flops + device_flops > 0:
        return cpu_flops / (cpu_flops + device_flops)
    if cpu_calls + device_calls > 0:
        return cpu_calls / (cpu_calls + device_calls)
    return None


def cpu_share(section: Compute) -> Optional[float]:
    share = section.get("device_share")
    return None if share is None else 1.0 - share


def layers_cpu_share(section: Compute) -> Optional[float]:
    """The CPU's share of the layers' compute alone (convolutions, products, attention,
    normalisation, recurrence), which the verdicts judge: fallbacks of other operators are
    named beside it, but a few elements of padding or NMS do not make a model "run on the
    CPU"."""
    other = section.get("other_fallback_work", {"calls": 0, "flops": 0})
    return _share(
        section["on_cpu"]["calls"] - other["calls"],
        section["on_cpu"]["flops"] - other["flops"],
        section["on_device"]["calls"],
        section["on_device"]["flops"],
    )


def _main_file() -> Optional[str]:
    """The program's main script (``dmlpatch.auto`` runs it again in a module of its own)."""
    import os

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(path, str) and sys.argv and os.path.isfile(sys.argv[0]):
        path = sys.argv[0]
    return os.path.abspath(path) if isinstance(path, str) else None


def headline(section: Compute) -> str:
    """One clause: how much model compute ran where, and what ran through CPU fallbacks."""
    share = cpu_share(section)
    device = section["device"]
    total = section["on_device"]["flops"] + section["on_cpu"]["flops"]
    through = fallback_clause(section)
    if share is None:
        if through:  # only fallbacks of other operators were counted
            return f"no layer ran{through}"
        return (
            "none counted (no convolution, matrix product, attention, normalisation or "
            "recurrent layer ran)"
        )
    if share == 0:
        return f"all model compute ({flops_text(total)}) ran on {device}{through}"
    on_cpu = flops_text(section["on_cpu"]["flops"])
    return (
        f"{share_text(share)} of model compute ({on_cpu} of {flops_text(total)}) "
        f"ran on the CPU, not on {device}{through}"
    )


def share_text(share: float) -> str:
    """``8%``: whole percents, except where rounding would say none, or all, of a share that
    is neither (the headline's CPU share and the page's device share say the same figure)."""
    percent = round(100 * share)
    if percent == 0 and share > 0:
        return "less than 1%"
    if percent == 100 and share < 1:
        return "more than 99%"
    return f"{percent}%"


def fallback_clause(section: Compute) -> str:
    """``; 2 operators through DirectML's CPU fallback (12 calls, 36 copies, 3.1 MB)``, or ""."""
    fallbacks = section.get("cpu_fallbacks") or []
    if not fallbacks:
        return ""
    calls = sum(entry["calls"] for entry in fallbacks)
    copies = sum(entry.get("copies", 0) for entry in fallbacks)
    moved = sum(entry.get("bytes", 0) for entry in fallbacks)
    operators = "operator" if len(fallbacks) == 1 else "operators"
    return (
        f"; {len(fallbacks)} {operators} through DirectML's CPU fallback ({calls} calls, "
        f"{copies} copies, {bytes_text(moved)})"
    )


def bytes_text(value: int) -> str:
    """``512 B``, ``1.5 kB`` ... ``2048.0 GB``: decimal units, as the copies' byte counts
    (999,999 bytes are ``1.0 MB``, not ``1000.0 kB``)."""
    if value < 1000:
        return f"{value} B"
    scaled = float(value)
    for unit in ("kB", "MB", "GB"):
        scaled /= 1000
        if round(scaled, 1) < 1000 or unit == "GB":
            break
    return f"{scaled:.1f} {unit}"


def fallback_line(section: Compute, argv: list[str]) -> Optional[str]:
    """The line an ordinary run says at exit when operators ran through DirectML's CPU
    fallback (most expensive first, by copies), or None."""
    fallbacks = sorted(
        section.get("cpu_fallbacks") or [],
        key=lambda entry: (-entry.get("bytes", 0), -entry["calls"]),
    )
    if not fallbacks:
        return None
    named = ", ".join(
        f"{entry['operator']} ({entry['calls']} calls, {entry.get('copies', 0)} copies, "
        f"{bytes_text(entry.get('bytes', 0))})"
        for entry in fallbacks[:_TOP_LINES]
    )
    more = f" and {len(fallbacks) - _TOP_LINES} more" if len(fallbacks) > _TOP_LINES else ""
    import shlex

    program = shlex.join(argv) if argv and argv[0] else "<program>"
    return f"ran through DirectML's CPU fallback: {named}{more}; see: dmlpatch check {program}"


def explain(section: Compute) -> list[str]:
    """The CPU lines, heaviest first, and the likely cause, for ``dmlpatch check``."""
    out = []
    for line in section["cpu_lines"]:
        through = line.get("fallbacks")
        how = f"; CPU fallback of {', '.join(through)}" if through else ""
        out.append(
            f"  cpu  {flops_text(line['flops']):>12}  {line['calls']:>6} calls  {line['display']}"
            f"  ({', '.join(line['families'])}{how})"
        )
    cause = section.get("likely_cause")
    if cause:
        out.append(f"likely cause: {cause['text']}")
    for part, what in (
        (section["data_loading_on_cpu"], "data loading"),
        (section["model_setup_on_cpu"], "modules being built (shape probes in __init__)"),
    ):
        if part["calls"]:
            out.append(
                f"  ({what} ran {part['calls']} heavy calls, {flops_text(part['flops'])}, on the "
                "CPU: not model compute)"
            )
    return out


def exit_warning(section: Compute, argv: list[str]) -> Optional[str]:
    """The one line an ordinary run says at exit, or None when most compute ran on the device
    or the run was a test suite (the pytest plugin warned test by test)."""
    if section.get("tests") is not None:
        return None
    share = layers_cpu_share(section)
    if share is None or share <= MOST:
        return None
    first = section["cpu_lines"][0]["display"] if section["cpu_lines"] else None
    where = f" (first at {first})" if first else ""
    cause = section.get("likely_cause")
    because = f"; likely cause: {cause['text']}" if cause else ""
    import shlex

    program = shlex.join(argv) if argv and argv[0] else "<program>"
    return f"{headline(section)}{where}{because}; see: dmlpatch check {program}"
