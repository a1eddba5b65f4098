"""The cost model on the simulated device: which adapter models it keeps (every shipped profile,
and the one it is configured as when that is a file), and their prices of what it ran.

The simulated device charges each kernel's roofline time on every configured model as it runs
(``dmlpatch_sim::set_cost_models``), so one run is priced on each shipped profile at once.
"""

from __future__ import annotations

from typing import Any, Optional

from dmlpatch.costs import active, pricing, profiles

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


def priced(profile: Optional[profiles.Profile] = None, counters: Any = None) -> pricing.Priced:
    """What the simulated device ran since its counters were last reset, priced on ``profile``
    (default: the one it is configured as; any configured one)."""
    from dmlpatch import sim
    from dmlpatch.sim import counting

    chosen = profile if profile is not None else active.current().profile
    slot = next((i for i, p in enumerate(_slots) if p == chosen), None)
    if slot is None:
        raise ValueError(f"the simulated device does not model the {chosen.name} profile")
    return pricing.price(
        counters if counters is not None else sim.counters(), counting.costs(), chosen, slot
    )


def seconds() -> float:
    """The modelled clock: seconds of DirectML time since the counters were last reset, on the
    profile the device is configured as."""
    return priced().total


def models() -> list[profiles.Profile]:
    """The configured adapter models, in slot order."""
    return list(_slots)
