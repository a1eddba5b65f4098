"""Which profile prices this process's device: decided once per process, with how.

In order: ``DMLPATCH_COST_PROFILE`` (a shipped profile's name, or a profile file a user was
sent or measured elsewhere); on real DirectML, the profile ``dmlpatch calibrate`` measured on
this adapter and driver; else the shipped profile closest to the adapter's name, said once on
real DirectML. The simulated device models the adapter it is configured as and never reads
measured profiles: its adapter is the profile.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import NamedTuple, Optional

from dmlpatch import log
from dmlpatch.costs import profiles
from dmlpatch.environment_variables import DMLPATCH_COST_PROFILE


class Chosen(NamedTuple):
    profile: profiles.Profile
    #: How it was chosen, in words ("measured on this adapter (<path>)").
    how: str


_chosen: Optional[Chosen] = None
_lock = threading.Lock()


def device() -> tuple[str, str]:
    """(backend, adapter name) of the device this process runs on: the simulated device where
    it is loaded, torch-directml's first adapter where it is imported, else ("", "")."""
    sim = sys.modules.get("dmlpatch.sim")
    if sim is not None and sim.is_loaded():
        return "sim", sim.device_name(0)
    directml = sys.modules.get("torch_directml")
    if directml is not None:
        try:
            return "directml", str(directml.device_name(0))
        except Exception as error:  # a query of the device must never break the program
            log.swallowed("costs.active.device", error)
            return "directml", ""
    return "", ""


def choose(backend: str, adapter: str) -> Chosen:
    """The profile for ``adapter`` on ``backend`` (``sim`` or ``directml``)."""
    named = os.environ.get(DMLPATCH_COST_PROFILE, "").strip()
    if named:
        given = _from_environment(named)
        if given is not None:
            return given
    if backend == "directml":
        from dmlpatch.costs import machine
        from dmlpatch.devices import adapters

        driver = adapters.driver_version(backend, adapter)
        measured = machine.load(adapter, driver)
        if measured is not None:
            return Chosen(measured, f"measured on this adapter ({machine.path(adapter, driver)})")
    closest, matched = profiles.closest(adapter)
    if matched:
        how = f"shipped, the closest to {adapter!r}"
    else:
        how = f"shipped, the default: {adapter!r} names no adapter class dmlpatch knows"
    if backend == "sim":
        how = f"shipped, the one the simulated adapter {adapter!r} is configured as"
    elif backend == "directml":
        log.say_once(
            "cost-profile",
            f"costs on {adapter!r} are modelled with the {closest.name} profile ({how}); "
            "`dmlpatch calibrate` measures this adapter's own",
        )
    return Chosen(closest, how)


def _from_environment(value: str) -> Optional[Chosen]:
    shipped = profiles.named(value)
    if shipped is not None:
        return Chosen(shipped, f"shipped, named by {DMLPATCH_COST_PROFILE}")
    try:
        with open(value, encoding="utf-8") as handle:
            data = json.load(handle)
        # A file calibrate wrote holds the profile under "profile"; a bare profile is fine too.
        profile = profiles.from_json(data.get("profile", data) if isinstance(data, dict) else data)
    except (OSError, ValueError) as error:
        log.warn_once(
            "cost-profile-environment",
            f"{DMLPATCH_COST_PROFILE}={value!r} is neither a shipped profile "
            f"({', '.join(profiles.SHIPPED)}) nor a readable profile file ({error}); ignored",
        )
        return None
    return Chosen(profile, f"from the file {value} ({DMLPATCH_COST_PROFILE})")


def current() -> Chosen:
    """The profile pricing this process's device (decided on first use)."""
    global _chosen
    chosen = _chosen
    if chosen is None:
        with _lock:
            if _chosen is None:
                _chosen = choose(*device())
            chosen = _chosen
    return chosen


def settle(backend: str, adapter: str) -> Chosen:
    """Decide now, for ``adapter`` on ``backend`` (the simulated device, as it loads)."""
    global _chosen
    with _lock:
        _chosen = choose(backend, adapter)
        return _chosen


def reset() -> None:
    """Forget the choice (tests; a process that changes ``DMLPATCH_COST_PROFILE``)."""
    global _chosen
    _chosen = None
