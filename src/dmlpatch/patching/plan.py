"""What to patch in this environment: specs matched against installed versions, cached.

Reading the specs needs tomllib, packaging and (for patch packs) importlib-metadata — about
60 ms of imports that every Python process of an activated environment would pay. The plan
they produce is small, so it is cached (marshal: no import) under ``<cache>/plans`` with the
files and directories it was computed from; a later process re-stats those and reuses it.
Installing or removing a distribution changes its site directory's mtime, which is one of them.
"""

from __future__ import annotations

import marshal
import os
import sys

from dmlpatch._version import __version__
from dmlpatch.paths import cache_directory, file_tag

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

FORMAT = 2
KEEP = 32


def load() -> dict[str, Any]:
    """The plan for this process: from the cache when nothing it depends on has changed."""
    key, path = _cache_file()
    cached = _read(path, key)
    if cached is not None:
        return cached
    plan = build()
    plan["key"] = key
    _write(path, plan)
    return plan


def build() -> dict[str, Any]:
    """Match every spec against installed versions (raises SpecError for a malformed spec)."""
    from dmlpatch._metadata import version_of
    from dmlpatch.patching import specs

    targets: list[list[Any]] = []
    wraps: list[list[Any]] = []
    aliases: list[list[Any]] = []
    leaves: list[list[Any]] = []
    warnings: list[list[Any]] = []
    inputs: list[str] = [entry or "." for entry in sys.path]
    for spec in specs.load_all():
        inputs.append(spec.origin)
        installed = version_of(spec.distribution)
        if installed is None:
            continue
        if not spec.versions.contains(installed, prereleases=True):
            warnings.append(
                [
                    f"version:{spec.name}",
                    f"patch spec {spec.name!r} is for {spec.distribution} {spec.versions}, but "
                    f"{installed} is installed; {spec.distribution} runs unpatched",
                    spec.name,
                    f"{spec.distribution} {installed} not in {spec.versions}",
                ]
            )
            # "Runs unpatched" includes discovery: the spec's author vouched for other versions.
            leaves.extend(
                [package, spec.name, f"{spec.distribution} {installed} is not covered", True]
                for package in spec.packages()
            )
            continue
        for rule in spec.rewrites:
            if rule.versions.contains(installed, prereleases=True):
                targets.extend(
                    [module, spec.name, rule.expect_sites, spec.fingerprint]
                    for module in rule.modules
                )
        for wrap in spec.wraps:
            if wrap.versions.contains(installed, prereleases=True):
                wraps.append([spec.name, wrap.target, wrap.fix, wrap.why])
        for alias in spec.aliases:
            if alias.versions.contains(installed, prereleases=True):
                aliases.append([alias.module, alias.target, spec.name])
        for leave in spec.leaves:
            if leave.versions.contains(installed, prereleases=True):
                leaves.extend([module, spec.name, leave.why, False] for module in leave.modules)
    for pack, message, reason in specs.skipped_packs():
        warnings.append([f"pack:{pack}", message, pack, reason])
    for name in specs.unmatched_disabled():
        warnings.append(
            [
                f"disable:{name}",
                f"DMLPATCH_DISABLE_PATCHES names {name!r}, but no patch spec or pack has that "
                "name (see dmlpatch list); it disables nothing",
                name,
                "named in DMLPATCH_DISABLE_PATCHES, but no such spec or pack",
            ]
        )
    inputs.extend(str(directory) for directory in specs.spec_directories())
    return {
        "format": FORMAT,
        "targets": targets,
        "wraps": wraps,
        "aliases": aliases,
        "leaves": leaves,
        "warnings": warnings,
        "inputs": [[path, *_stat(path)] for path in dict.fromkeys(inputs)],
    }


def _cache_file() -> tuple[str, str]:
    key = repr(
        (
            __version__,
            sys.version_info[:2],
            sys.path,
            os.environ.get("DMLPATCH_PATCHES", ""),
            os.environ.get("DMLPATCH_DISABLE_PATCHES", ""),
        )
    )
    # The tag names the file; the key itself is stored and compared, so a collision only misses.
    name = f"{file_tag(key)}.plan"
    return key, os.path.join(cache_directory(), "plans", name)


def _stat(path: str) -> list[int]:
    try:
        status = os.stat(path)
    except OSError:
        return [-1, -1]
    return [status.st_mtime_ns, status.st_size]


def _read(path: str, key: str) -> Optional[dict[str, Any]]:
    try:
        with open(path, "rb") as stream:
            plan = marshal.load(stream)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if not isinstance(plan, dict) or plan.get("format") != FORMAT or plan.get("key") != key:
        return None
    try:
        for entry in plan["inputs"]:
            if _stat(entry[0]) != entry[1:]:
                return None
    except (KeyError, TypeError, IndexError):
        return None
    return plan


def _write(path: str, plan: dict[str, Any]) -> None:
    """Atomically; a cache that cannot be written is simply not used."""
    from dmlpatch import atomic

    try:
        atomic.write(path, marshal.dumps(plan))
    except (OSError, ValueError):
        return
    _prune(os.path.dirname(path))


def _prune(directory: str, keep: int = KEEP) -> None:
    """Plans for environments and spec sets that are gone would pile up: keep the newest."""
    try:
        plans = [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".plan")]
        plans.sort(key=os.path.getmtime)
        for stale in plans[:-keep]:
            os.unlink(stale)
    except OSError:
        return
