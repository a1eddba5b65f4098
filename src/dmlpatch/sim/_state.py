"""What this process loaded: set once by :func:`dmlpatch.sim.backend.load`, read everywhere."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dmlpatch.environment_variables import DMLPATCH_SIM_ADAPTERS

#: ``;``-separated adapter names the simulated adapters take, in order (to see what dmlpatch
#: says about a given GPU: ``DMLPATCH_SIM_ADAPTERS="AMD Radeon RX 6600"``).


@dataclass(frozen=True)
class Loaded:
    profile: str
    devices: int
    float64: bool
    trace: bool


CURRENT: Loaded | None = None


def device_count() -> int:
    return CURRENT.devices if CURRENT is not None else 0


def float64() -> bool:
    return CURRENT.float64 if CURRENT is not None else True


def device_name(index: int, count: int | None = None) -> str:
    """Adapter names, ordered as DirectML orders them: discrete adapters, then integrated.

    ``count``: the adapters there are (default: those loaded).
    """
    count = device_count() if count is None else count
    given = named()
    if index < len(given):
        return given[index]
    if count > 1 and index == count - 1:
        return "Simulated UHD (integrated)"
    if index == 0:
        return "Simulated Radeon (discrete)"
    return f"Simulated Radeon #{index + 1} (discrete)"


def named() -> list[str]:
    """The names ``$DMLPATCH_SIM_ADAPTERS`` gives, in order."""
    return [
        name.strip()
        for name in os.environ.get(DMLPATCH_SIM_ADAPTERS, "").split(";")
        if name.strip()
    ]
