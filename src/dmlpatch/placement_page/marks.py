"""What a source line is marked with on the page: where its compute ran, and why, in words.

A line can do several things (a layer on the device and a fallback inside it); the mark is the
costliest place, the words list them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from dmlpatch.placement.summary import bytes_text, flops_text

if TYPE_CHECKING:
    from dmlpatch.report_types import Line, LineWork

#: The report's own words for amounts, re-exported for the page.
size, flops = bytes_text, flops_text

DEVICE = "device"
FIXED = "fixed"
FALLBACK = "fallback"
CPU = "cpu"
#: From the costliest down: the colour a line takes.
ORDER = (FALLBACK, CPU, FIXED, DEVICE)
LEGEND = {
    DEVICE: "ran on the device",
    FIXED: "fixed on the device by dmlpatch",
    FALLBACK: "DirectML's CPU fallback (copies to and from the host)",
    CPU: "left on the CPU by the program",
}


class Mark(NamedTuple):
    place: str
    #: One sentence per place the line's compute went.
    reasons: list[str]
    #: The operators involved (fallbacks and fixes), for the catalogue links.
    operators: list[tuple[str, str]]


def duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def _calls(count: int) -> str:
    return f"{count} call" + ("" if count == 1 else "s")


def of_line(entry: Line, device: str) -> Mark:
    """The mark of one entry of the report's ``compute.lines``."""
    reasons: list[str] = []
    operators: list[tuple[str, str]] = []
    places: set[str] = set()
    for fallback in entry.get("fallbacks") or ():
        places.add(FALLBACK)
        operators.append((fallback["operator"], FALLBACK))
        copies = fallback.get("copies")
        moved = (
            f"{copies} copies ({size(fallback.get('bytes', 0))})"
            if copies is not None
            else "its copies counted per operator (see the fallback table)"
        )
        reasons.append(
            f"{fallback['operator']} ran through DirectML's CPU fallback: "
            f"{_calls(fallback['calls'])}, {moved}, {duration(fallback.get('seconds', 0.0))}"
        )
    cpu = entry.get("cpu") or {}
    if cpu.get("calls"):
        places.add(CPU)
        reasons.append(
            f"on the CPU, where the program left its tensors: {_calls(cpu['calls'])}, "
            f"{flops(cpu.get('flops', 0))} ({_families(cpu)})"
        )
    for operator, count in (entry.get("fixed") or {}).items():
        places.add(FIXED)
        operators.append((operator, FIXED))
        reasons.append(
            f"{operator} fixed on the device by dmlpatch ({_calls(count)}): DirectML alone "
            "would refuse it or send it to the CPU"
        )
    on_device = entry.get("device") or {}
    if on_device.get("calls"):
        places.add(DEVICE)
        reasons.append(
            f"on {device}: {_calls(on_device['calls'])}, {flops(on_device.get('flops', 0))} "
            f"({_families(on_device)})"
        )
    place = next((p for p in ORDER if p in places), DEVICE)
    return Mark(place, reasons, operators)


def _families(part: LineWork) -> str:
    return ", ".join(part.get("families") or ()) or "model compute"
