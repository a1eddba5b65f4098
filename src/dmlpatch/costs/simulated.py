"""The cost model on the simulated device: which adapter models it keeps (every shipped profile,
and the one it is configured as when that is a file), and their prices of what it ran.

The simulated device charges each kernel's roofline time on every configured model as it runs
(``dmlpatch_sim::set_cost_models``), so one run is priced on each shipped profile at once.
"""

from __future__ import annotations

from typing import Any, Optional

from dmlpatch.costs import active, pricing, profiles

TYPE_CHECKING = False
if TYPE_CHECKING:
    from dmlpatch.report_types import Modelled, OperatorTime

_slots: list[profiles.Profile] = []


def configure(adapter: str) -> None:
    """Give the simulated device its adapter models (called once, as it loads, with its first
    adapter's name)."""
    import torch

    chosen = active.settle("sim", adapter).profile
    slots = list(profiles.SHIPPED.values())
    if chosen.name not in profiles.SHIPPED or chosen != profiles.SHIPPED[chosen.name]:
        slots.append(chosen)
    lines = "".join(f"{p.memory_gbps}\t{p.float_tflops}\t{p.half_tflops}\n" for p in slots)
    torch.ops.dmlpatch_sim.set_cost_models(lines)
    _slots[:] = slots
    from dmlpatch.costs import steps

    steps.install()


def priced(profile: Optional[profiles.Profile] = None, counters: Any = None) -> pricing.Priced:
    """What the simulated device ran since its counters were last reset, priced on ``profile``
    (default: the one it is configured as; any configured one)."""
    from dmlpatch.sim import counting

    chosen = profile if profile is not None else active.current().profile
    slot = next((i for i, p in enumerate(_slots) if p == chosen), None)
    if slot is None:
        raise ValueError(f"the simulated device does not model the {chosen.name} profile")
    return pricing.price(
        counters if counters is not None else counting.snapshot(), counting.costs(), chosen, slot
    )


def seconds() -> float:
    """The modelled clock: seconds of DirectML time since the counters were last reset, on the
    profile the device is configured as."""
    return priced().total


def models() -> list[profiles.Profile]:
    """The configured adapter models, in slot order."""
    return list(_slots)


def section(top: int = 10) -> Modelled:
    """The report's ``modelled`` section: what the simulated device ran since its counters were
    last reset, priced on the profile it is configured as, per optimizer step where there were
    steps (else per run), beside the wall time of the same span."""
    from dmlpatch.costs import steps

    chosen = active.current()
    counted, wall = steps.counted()
    per = max(counted, 1)
    priced_per = priced(chosen.profile).per(per)
    data = priced_per.to_json(top)
    return {
        "profile": data["profile"],
        "how": chosen.how,
        "steps": counted,
        "seconds": data["seconds"],
        "wall_seconds": wall / per,
        "by_cause": data["by_cause"],
        "by_operator": data["by_operator"],
        "launches": data["launches"],
        "readbacks": data["readbacks"],
        "copied_bytes": data["copied_bytes"],
        "flops": data["flops"],
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} µs"


_CAUSE_WORDS = {
    "launch": "launches",
    "readback": "read-backs",
    "copy": "copies",
    "compute": "compute",
    "host": "CPU fallbacks",
}


def describe(section: Modelled, most: int = 3) -> list[str]:
    """The section in lines for a terminal (``dmlpatch check``)."""
    per = f"per step over {section['steps']} steps" if section["steps"] else "for the run"
    by_cause = section["by_cause"]
    causes = {
        "launch": by_cause["launch"],
        "readback": by_cause["readback"],
        "copy": by_cause["copy"],
        "compute": by_cause["compute"],
        "host": by_cause["host"],
    }
    lines = [
        f"modelled DirectML time: {_ms(section['seconds'])} {per} on {section['profile']} "
        f"({section['how']}); wall time here {_ms(section['wall_seconds'])}"
        + (" per step" if section["steps"] else "")
        + " (the simulator's kernels are the CPU's)",
        "  by cause: "
        + ", ".join(f"{word} {_ms(causes[cause])}" for cause, word in _CAUSE_WORDS.items()),
    ]
    ranked = [entry for entry in section["by_operator"][:most] if entry["seconds"] > 0]
    if ranked:

        def main_cause(entry: OperatorTime) -> str:
            split: dict[str, Any] = dict(entry)
            return _CAUSE_WORDS[max(_CAUSE_WORDS, key=lambda name: split[name])]

        lines.append(
            "  most: "
            + ", ".join(
                f"{entry['operator']} {_ms(entry['seconds'])} (mostly {main_cause(entry)})"
                for entry in ranked
            )
        )
    return lines
