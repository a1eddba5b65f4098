"""Per call, a fix's composition on the device or DirectML's own CPU fallback: whichever the
adapter's profile says is faster.

A fix that replaces a fallback states both costs as functions of the call's shapes (its module's
``COSTS``: operator -> :data:`CostFunction`): its composition's kernel launches, read-backs,
bytes moved and FLOPs (:class:`OnDevice`), and what the fallback would copy each way and compute
on the host (:class:`ThroughTheCpu`). A
:class:`Chooser` prices both on the process's profile (:mod:`dmlpatch.costs.active`) once per
distinct key (the shapes and dtype that decide the cost) and remembers the answer, so a call
whose key was seen costs one dictionary lookup.

``DMLPATCH_CPU_OPS`` sends an operator to the CPU before any fix sees it; its inverse,
``DMLPATCH_DEVICE_OPS`` (operators, or ``all``), keeps the composition whatever it costs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Hashable, Iterator
from typing import Callable, NamedTuple

from dmlpatch import log
from dmlpatch.costs import active, profiles
from dmlpatch.environment_variables import DMLPATCH_DEVICE_OPS

#: Distinct keys remembered per fix before the memory is cleared (a program whose shapes never
#: repeat must not grow it without bound).
_MOST_KEYS = 4096


class OnDevice(NamedTuple):
    """A composition's cost on the device for one call."""

    launches: float
    readbacks: float = 0.0
    #: Bytes its kernels read and write in all.
    bytes: float = 0.0
    flops: float = 0.0
    half: bool = False


class ThroughTheCpu(NamedTuple):
    """DirectML's CPU fallback of one call: its device arguments copied down (each a
    read-back), its results copied back, and its CPU kernel (one call's overhead and
    ``host_flops``; a batch of small matrices adds about 0.1 µs a matrix on one thread here,
    which the FLOPs cover)."""

    down_bytes: float
    up_bytes: float
    arguments: int = 1
    host_flops: float = 0.0


class Costs(NamedTuple):
    """Both sides of one call: the composition's, and the fallback's it replaces."""

    device: OnDevice
    fallback: ThroughTheCpu


#: A fix's statement of its cost: the call's arguments (as its kernel gets them) -> both sides.
CostFunction = Callable[..., Costs]


def device_seconds(cost: OnDevice, profile: profiles.Profile) -> float:
    rate = (profile.half_tflops if cost.half else profile.float_tflops) * 1e12
    compute = max(cost.bytes / (profile.memory_gbps * 1e9), cost.flops / rate)
    return (
        cost.launches * profile.launch_us * 1e-6
        + cost.readbacks * profile.readback_us * 1e-6
        + compute
    )


def fallback_seconds(cost: ThroughTheCpu, profile: profiles.Profile) -> float:
    return (
        cost.arguments * profile.readback_us * 1e-6
        + cost.down_bytes / (profile.download_gbps * 1e9)
        + cost.up_bytes / (profile.upload_gbps * 1e9)
        + profile.host_call_us * 1e-6
        + cost.host_flops / (profile.host_gflops * 1e9)
    )


#: Every chooser's answer while :func:`forcing` is in force (``dmlpatch calibrate`` times both
#: sides of a call); None: each decides.
_forcing: bool | None = None


@contextlib.contextmanager
def forcing(on_device: bool) -> Iterator[None]:
    """Every fix takes its composition (``True``) or DirectML's fallback (``False``) inside."""
    global _forcing
    before, _forcing = _forcing, on_device
    try:
        yield
    finally:
        _forcing = before


def _forced_to_device() -> frozenset[str]:
    listed = os.environ.get(DMLPATCH_DEVICE_OPS, "")
    return frozenset(entry.strip() for entry in listed.split(",") if entry.strip())


class Chooser:
    """The choice for one fixed operator (``aten::_linalg_eigh``), remembered per key."""

    def __init__(self, operator: str) -> None:
        self.operator = operator
        self._answers: dict[Hashable, bool] = {}
        self._forced: bool | None = None

    def on_device(self, key: Hashable, costs: Callable[[], Costs]) -> bool:
        """Whether this call (whose cost ``key`` decides: its shapes, its dtype) takes the
        composition; ``costs`` is called only for a key not seen before."""
        if _forcing is not None:
            return _forcing
        answer = self._answers.get(key)
        if answer is None:
            answer = self._decide(key, costs)
        return answer

    def _decide(self, key: Hashable, costs: Callable[[], Costs]) -> bool:
        if self._forced is None:
            forced = _forced_to_device()
            self._forced = "all" in forced or self.operator in forced
        if self._forced:
            answer = True
        else:
            profile = active.current().profile
            both = costs()
            on_device = device_seconds(both.device, profile)
            through = fallback_seconds(both.fallback, profile)
            answer = on_device <= through
            log.info(
                f"{self.operator} {key}: "
                + ("the composition on the device" if answer else "DirectML's CPU fallback")
                + f" ({on_device * 1e6:.0f} µs against {through * 1e6:.0f} µs, modelled on "
                f"{profile.name})"
            )
        if len(self._answers) >= _MOST_KEYS:
            self._answers.clear()
        self._answers[key] = answer
        return answer

    def reset(self) -> None:
        self._answers.clear()
        self._forced = None
