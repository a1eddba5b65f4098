"""Modelled DirectML time of what the simulated device ran: its counts priced on an adapter
profile, split by cause and by operator.

The simulated device counts, per operator, the kernels it launched, the bytes and FLOPs of
each kernel and their roofline time on every configured adapter, the values the host waited
for, the bytes a CPU fallback copied each way and the CPU time of the fallback's kernel
(``dmlpatch_sim::costs``); the program's own copies are its transfer counters. This module
adds them up on a :class:`~dmlpatch.costs.profiles.Profile`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from dmlpatch.costs.profiles import Profile

#: Operators the simulated device counts that launch no kernel on DirectML: views, allocation,
#: storage surgery, and the host's reads and copies (priced as read-backs and copies).
NO_KERNEL = frozenset(
    {
        "aten::view",
        "aten::as_strided",
        "aten::_reshape_alias",
        "aten::empty.memory_format",
        "aten::empty_strided",
        "aten::resize_",
        "aten::set_",
        "aten::set_.source_Storage",
        "aten::set_.source_Storage_storage_offset",
        "aten::set_.source_Tensor",
        "aten::_local_scalar_dense",
        "aten::_copy_from_and_resize",
        "aten::alias",
        "aten::_unsafe_view",
        "aten::unfold",
        "aten::lift_fresh",
    }
)
#: Rows of the per-operator table that are not operators.
TO_DEVICE = "copies to the device"
TO_HOST = "copies to the host"
SCALAR_READS = "scalar reads (.item())"

CAUSES = ("launch", "readback", "copy", "compute", "host")


class Split(NamedTuple):
    """Seconds by cause: kernel launches, read-backs (each drains the queue), host<->device
    copies, device compute (roofline), and CPU fallbacks' kernels on the host."""

    launch: float = 0.0
    readback: float = 0.0
    copy: float = 0.0
    compute: float = 0.0
    host: float = 0.0

    @property
    def total(self) -> float:
        return self.launch + self.readback + self.copy + self.compute + self.host

    def __add__(self, other: Any) -> Split:
        return Split(*(a + b for a, b in zip(self, other)))

    def scaled(self, factor: float) -> Split:
        return Split(*(value * factor for value in self))


class Priced(NamedTuple):
    """One run (or one step) priced on one profile."""

    profile: str
    split: Split
    #: Operator (or one of :data:`TO_DEVICE`, :data:`TO_HOST`, :data:`SCALAR_READS`) -> split.
    by_operator: Mapping[str, Split]
    launches: int
    readbacks: int
    copied_bytes: int
    flops: int

    @property
    def total(self) -> float:
        return self.split.total

    def per(self, steps: int) -> Priced:
        """The same figures divided over ``steps`` steps."""
        if steps <= 1:
            return self
        factor = 1.0 / steps
        return Priced(
            self.profile,
            self.split.scaled(factor),
            {name: split.scaled(factor) for name, split in self.by_operator.items()},
            round(self.launches * factor),
            round(self.readbacks * factor),
            round(self.copied_bytes * factor),
            round(self.flops * factor),
        )

    def to_json(self, top: int = 10) -> dict[str, Any]:
        ranked = sorted(self.by_operator.items(), key=lambda item: -item[1].total)[:top]
        return {
            "profile": self.profile,
            "seconds": self.total,
            "by_cause": dict(zip(CAUSES, self.split)),
            "by_operator": [
                {"operator": name, "seconds": split.total, **dict(zip(CAUSES, split))}
                for name, split in ranked
            ],
            "launches": self.launches,
            "readbacks": self.readbacks,
            "copied_bytes": self.copied_bytes,
            "flops": self.flops,
        }


def price(
    counters: Mapping[str, Any], costs: Mapping[str, Mapping[str, Any]], profile: Profile, slot: int
) -> Priced:
    """``counters`` (:func:`dmlpatch.sim.counters`) and ``costs``
    (:func:`dmlpatch.sim.counting.costs`) priced on ``profile``, whose roofline times are the
    simulated device's ``slot``."""
    launch_s = profile.launch_us * 1e-6
    readback_s = profile.readback_us * 1e-6
    up = profile.upload_gbps * 1e9
    down = profile.download_gbps * 1e9
    transfers = counters.get("transfers") or {}
    moved = sum(int(entry.get("count", 0)) for entry in transfers.values())
    by_operator: dict[str, Split] = {}
    launches = readbacks = copied = flops = 0

    def charge(name: str, split: Split) -> None:
        if split.total > 0:
            by_operator[name] = by_operator.get(name, Split()) + split

    for name, calls in (counters.get("ops") or {}).get("native", {}).items():
        kernels = calls
        if name == "aten::_copy_from":
            kernels = max(0, calls - moved)  # the rest are copies, priced as such
        elif name in NO_KERNEL:
            kernels = 0
        launches += kernels
        charge(name, Split(launch=kernels * launch_s))
    for name, entry in costs.items():
        computed = entry["compute_ps"][slot] * 1e-12 if slot < len(entry["compute_ps"]) else 0.0
        readbacks += entry["readbacks"]
        copied += entry["readback_bytes"] + entry["upload_bytes"]
        flops += entry["flops"]
        charge(
            name,
            Split(
                readback=entry["readbacks"] * readback_s,
                copy=entry["readback_bytes"] / down + entry["upload_bytes"] / up,
                compute=computed,
                host=entry["cpu_ns"] * 1e-9,
            ),
        )
    h2d = transfers.get("h2d", {"count": 0, "bytes": 0})
    d2h = transfers.get("d2h", {"count": 0, "bytes": 0})
    d2d = transfers.get("d2d", {"count": 0, "bytes": 0})
    charge(TO_DEVICE, Split(copy=h2d["bytes"] / up + d2d["bytes"] / up))
    charge(TO_HOST, Split(readback=d2h["count"] * readback_s, copy=d2h["bytes"] / down))
    syncs = int(counters.get("syncs", 0))
    charge(SCALAR_READS, Split(readback=syncs * readback_s))
    readbacks += d2h["count"] + syncs
    copied += h2d["bytes"] + d2h["bytes"] + d2d["bytes"]
    total = Split()
    for split in by_operator.values():
        total = total + split
    return Priced(profile.name, total, by_operator, launches, readbacks, copied, flops)
