"""What this process loaded: set once by :func:`dmlpatch.sim.backend.load`, read everywhere."""

from __future__ import annotations

from dataclasses import dataclass


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
    if count > 1 and index == count - 1:
        return "Simulated UHD (integrated)"
    if index == 0:
        return "Simulated Radeon (discrete)"
    return f"Simulated Radeon #{index + 1} (discrete)"
