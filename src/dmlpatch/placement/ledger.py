"""The counts: model compute on the device, model compute on the CPU (per source line, and per
operator where a CPU fallback ran it on device tensors), and CPU work that belongs to data
loading.

One ledger per process, filled by whichever counter is on (:mod:`.module_hooks` in ordinary
runs, :mod:`.operators` under ``dmlpatch check``) and read at exit by :mod:`.summary`.
"""

from __future__ import annotations

import _thread
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # frames imports torch; the ledger itself needs nothing of it
    from dmlpatch.placement.frames import Site

CPU = "cpu"
#: The family of operators outside the layer families (:data:`.families.OTHER`).
OTHER = "other operator"
LOADING = "data loading"
BUILDING = "model set-up"


class Ledger:
    """Calls and FLOPs per place (a torch device type, or :data:`LOADING` / :data:`BUILDING`
    for CPU work of data loading / of modules being built), and per source line for model
    compute on the CPU.

    Places are device types rather than "the device": the device is known only once it is
    resolved, which an activated program may never ask for until exit.
    """

    def __init__(self, counted: str) -> None:
        #: What was counted: ``layers`` (nn.Module calls) or ``operators`` (ATen calls).
        self.counted = counted
        self._lock = _thread.allocate_lock()
        self.places: dict[str, list[int]] = {}
        self.cpu_sites: dict[Optional[Site], dict[str, Any]] = {}
        #: Operator -> calls, FLOPs and first line, for compute a fallback ran on the CPU.
        self.fallbacks: dict[str, dict[str, Any]] = {}
        #: Per source line, model compute on the device and operators fixed there: kept only
        #: for the HTML report (:meth:`keep_lines`), whose page marks every line that computed.
        self.device_sites: Optional[dict[Site, dict[str, Any]]] = None

    def keep_lines(self) -> None:
        """Record the line of device compute too, not only of CPU compute."""
        if self.device_sites is None:
            self.device_sites = {}

    @property
    def keeps_lines(self) -> bool:
        return self.device_sites is not None

    def add_device(
        self,
        place: str,
        flops: int,
        site: Optional[Site],
        family: str,
        fixed: Optional[str] = None,
    ) -> None:
        """Model compute on the device, run from ``site``; ``fixed``: the operator a dmlpatch
        fix served there (DirectML alone would have refused it or sent it to the CPU)."""
        self.add(place, flops)
        self.note_device_line(site, family, flops, fixed)

    def note_device_line(
        self, site: Optional[Site], family: str, flops: int, fixed: Optional[str] = None
    ) -> None:
        """The line-level record alone (an operator outside the layer families that a fix
        served: on its line, but not in the totals the verdicts judge)."""
        lines = self.device_sites
        if lines is None or site is None:
            return
        with self._lock:
            entry = lines.get(site)
            if entry is None:
                entry = lines[site] = {"calls": 0, "flops": 0, "families": set(), "fixed": {}}
            if family != OTHER:
                entry["calls"] += 1
                entry["flops"] += flops
                entry["families"].add(family)
            if fixed is not None:
                entry["fixed"][fixed] = entry["fixed"].get(fixed, 0) + 1

    def add(self, place: str, flops: int) -> None:
        with self._lock:
            entry = self.places.get(place)
            if entry is None:
                self.places[place] = [1, flops]
            else:
                entry[0] += 1
                entry[1] += flops

    def add_cpu(
        self,
        site: Optional[Site],
        family: str,
        flops: int,
        fallback: Optional[str] = None,
        copies: Optional[int] = 0,
        nbytes: int = 0,
        seconds: float = 0.0,
    ) -> None:
        """Model compute on the CPU, run from ``site``; ``fallback``: the operator whose CPU
        fallback ran it although its arguments were on the device, with the copies (and their
        bytes) it made between host and device (None: not known per call, the backend counts
        them per operator) and the time the call took."""
        self.add(CPU, flops)
        with self._lock:
            entry = self.cpu_sites.get(site)
            if entry is None:
                entry = self.cpu_sites[site] = {
                    "calls": 0,
                    "flops": 0,
                    "families": set(),
                    "fallbacks": set(),
                    "fallback_costs": {},
                }
            entry["calls"] += 1
            entry["flops"] += flops
            entry["families"].add(family)
            if fallback is not None:
                entry["fallbacks"].add(fallback)
                cost = entry["fallback_costs"].get(fallback)
                if cost is None:
                    cost = entry["fallback_costs"][fallback] = {
                        "calls": 0,
                        "flops": 0,
                        "copies": 0 if copies is not None else None,
                        "bytes": 0,
                        "seconds": 0.0,
                    }
                cost["calls"] += 1
                cost["flops"] += flops
                cost["seconds"] += seconds
                if copies is not None and cost["copies"] is not None:
                    cost["copies"] += copies
                    cost["bytes"] += nbytes
                tally = self.fallbacks.get(fallback)
                if tally is None:
                    tally = self.fallbacks[fallback] = {
                        "calls": 0,
                        "flops": 0,
                        "copies": 0,
                        "bytes": 0,
                        "site": site,
                        "family": family,
                        "seconds": 0.0,
                    }
                tally["calls"] += 1
                tally["flops"] += flops
                tally["copies"] += copies or 0
                tally["bytes"] += nbytes
                tally["seconds"] += seconds

    def totals(self, place: str) -> tuple[int, int]:
        with self._lock:
            calls, flops = self.places.get(place, (0, 0))
        return calls, flops

    def others(self, *known: str) -> tuple[int, int]:
        """Calls and FLOPs on places other than ``known``."""
        calls = flops = 0
        with self._lock:
            for place, (c, f) in self.places.items():
                if place not in known:
                    calls, flops = calls + c, flops + f
        return calls, flops

    def model_compute(self) -> bool:
        """Whether any model compute (not data loading or set-up) was counted."""
        with self._lock:
            return any(place not in (LOADING, BUILDING) for place in self.places)

    def heaviest_cpu_sites(self) -> list[tuple[Optional[Site], dict[str, Any]]]:
        with self._lock:
            return sorted(self.cpu_sites.items(), key=lambda item: -item[1]["flops"])

    def heaviest_fallbacks(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return sorted(self.fallbacks.items(), key=lambda item: -item[1]["flops"])

    def reset(self) -> None:
        with self._lock:
            self.places.clear()
            self.cpu_sites.clear()
            self.fallbacks.clear()
            if self.device_sites is not None:
                self.device_sites.clear()

    def lines(self) -> list[tuple[Site, dict[str, Any]]]:
        """Every recorded line with what ran there (device, fixes, CPU, fallbacks)."""
        with self._lock:
            merged: dict[Site, dict[str, Any]] = {}
            for site, entry in (self.device_sites or {}).items():
                merged[site] = {"device": entry}
            for cpu_site, entry in self.cpu_sites.items():
                if cpu_site is not None:
                    merged.setdefault(cpu_site, {})["cpu"] = entry
        return sorted(merged.items(), key=lambda item: (item[0].file, item[0].line))


_current: Optional[Ledger] = None


def start(counted: str) -> Ledger:
    """The process's ledger from now on."""
    global _current
    _current = Ledger(counted)
    return _current


def current() -> Optional[Ledger]:
    return _current


def stop() -> None:
    global _current
    _current = None
