"""Profiles measured on the user's adapters (``dmlpatch calibrate``), kept in dmlpatch's cache.

One file per adapter and driver: ``<cache>/profiles/<tag>.json``, the tag naming the adapter's
name and its driver's version, so a new driver means a new measurement rather than a stale one.
Written atomically (:mod:`dmlpatch.atomic`); read back checked. A file that cannot be read as a
profile of this format (cut short, edited, from another version of the format) is ignored with
one line saying so and what rebuilds it, and is removed so that the line is said once.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from dmlpatch import atomic, log
from dmlpatch.costs import profiles
from dmlpatch.paths import cache_subdirectory, file_tag

FORMAT = 1
_SUBDIRECTORY = "profiles"


def path(adapter: str, driver: str, create: bool = False) -> Optional[str]:
    """Where the profile measured on ``adapter`` with ``driver`` lives (None: no cache)."""
    directory = cache_subdirectory(_SUBDIRECTORY, create=create)
    if directory is None:
        return None
    return os.path.join(directory, f"{file_tag(adapter + chr(0) + driver)}.json")


def load(adapter: str, driver: str) -> Optional[profiles.Profile]:
    """The profile measured on this adapter and driver; None when there is none or it is
    unusable (said once, and the file removed)."""
    where = path(adapter, driver)
    if where is None or not os.path.isfile(where):
        return None
    try:
        with open(where, encoding="utf-8") as handle:
            data = json.load(handle)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a profile of format {FORMAT}")
        if data.get("adapter") != adapter or data.get("driver") != driver:
            raise ValueError("measured on another adapter or driver")
        return profiles.from_json(data.get("profile"))
    except (OSError, ValueError) as error:  # json's errors are ValueErrors
        log.warn_once(
            f"profile:{where}",
            f"ignored the measured profile {where} ({error}); `dmlpatch calibrate` measures "
            "this adapter again",
        )
        try:
            os.unlink(where)
        except OSError as removal:
            log.swallowed("costs.machine.load", removal)
        return None


def save(
    adapter: str,
    driver: str,
    profile: profiles.Profile,
    fixes: Optional[list[dict[str, Any]]] = None,
) -> str:
    """Write the profile measured on ``adapter`` with ``driver`` (and ``fixes``: each fix timed
    both ways, kept for whoever reads the file); returns the path. Raises ``OSError`` where
    the cache cannot be written."""
    where = path(adapter, driver, create=True)
    if where is None:
        raise OSError("dmlpatch's cache directory cannot be written")
    data = {
        "format": FORMAT,
        "adapter": adapter,
        "driver": driver,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "profile": profile.to_json(),
        "fixes": fixes or [],
    }
    atomic.write(where, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return where
