"""What to patch in this environment: specs matched against installed versions, cached.

Reading the specs needs tomllib, packaging and (for patch packs) importlib-metadata — about
60 ms of imports that every Python process of an activated environment would pay. The plan
they produce is small, so it is cached (marshal: no import) under ``<cache>/plans`` with the
files and directories it was computed from; a later process re-stats those and reuses it.
Installing or removing a distribution changes its site directory's mtime, which is one of them.

Each entry is stored as the field values of the record type that reads it back
(:class:`~dmlpatch.rewriting.hook.ModuleTarget`, :class:`~dmlpatch.specs.wrapping.Fix`, ...),
and the cache is keyed on those types' field names: a field added, removed or reordered makes an
old cache a miss instead of a misread. A plan names modules to import and functions to wrap, so
it is read only from a file this user owns (``dmlpatch.trust``), and every entry is checked
against its record's field types: a plan damaged in any way is a miss, built again.
"""

from __future__ import annotations

import marshal
import os
import sys

from dmlpatch._version import __version__
from dmlpatch.environment_variables import DMLPATCH_DISABLE_PATCHES, DMLPATCH_PATCHES
from dmlpatch.paths import cache_subdirectory, file_tag
from dmlpatch.rewriting.discovery import Leave
from dmlpatch.rewriting.hook import ModuleTarget
from dmlpatch.specs.wrapping import Fix

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple, Optional
else:
    from dmlpatch._tuple import NamedTuple

FORMAT = 3  # the container; the records' layouts are in layout()
KEEP = 32


class Alias(NamedTuple):
    """One ``[[alias]]`` entry: ``module`` is provided by ``target``."""

    module: str
    target: str
    spec: str


class SpecWarning(NamedTuple):
    """A warning the plan's reader says once (a version gate, a skipped pack, a typo)."""

    key: str
    message: str
    spec: str
    reason: str


#: The plan's sections and the record type each entry is read back as.
RECORDS: dict[str, Any] = {
    "targets": ModuleTarget,
    "wraps": Fix,
    "aliases": Alias,
    "leaves": Leave,
    "warnings": SpecWarning,
}

#: The type of each field of each section's record, in order: what a cached entry must hold.
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "targets": (str, str, int, str, str, bool),
    "wraps": (str, str, str, str),
    "aliases": (str, str, str),
    "leaves": (str, str, str, bool),
    "warnings": (str, str, str, str),
}


def layout() -> tuple[Any, ...]:
    """What a cached plan must have been written with to be read by this code."""
    return (FORMAT, *((section, record._fields) for section, record in RECORDS.items()))


def load() -> dict[str, Any]:
    """The plan for this process: from the cache when nothing it depends on has changed."""
    key, path = _cache_file()
    cached = _read(path, key) if path is not None else None
    if cached is not None:
        return cached
    plan = build()
    plan["key"] = key
    if path is not None:
        _write(path, plan)
    return plan


def build() -> dict[str, Any]:
    """Match every spec against installed versions (raises SpecError for a malformed spec)."""
    from dmlpatch._metadata import version_of
    from dmlpatch.specs import loading

    targets: list[tuple[Any, ...]] = []
    wraps: list[tuple[Any, ...]] = []
    aliases: list[tuple[Any, ...]] = []
    leaves: list[tuple[Any, ...]] = []
    warnings: list[tuple[Any, ...]] = []
    inputs: list[str] = [entry or "." for entry in sys.path]
    loaded = loading.load_all()
    replaced = loading.replaced()
    for spec in loaded:
        if spec.name in replaced:
            # A local fix for a stale spec, or anything else: its fixes run as dmlpatch's own.
            warnings.append(
                SpecWarning(
                    key=f"replaced:{spec.name}",
                    message=loading.describe_local(spec, replaced[spec.name]),
                    spec=spec.name,
                    reason=f"replaced by {DMLPATCH_PATCHES} ({spec.origin})",
                )
            )
    for spec in loaded:
        inputs.append(spec.origin)
        installed = version_of(spec.distribution)
        if installed is None:
            continue
        if not spec.versions.contains(installed, prereleases=True):
            warnings.append(
                SpecWarning(
                    key=f"version:{spec.name}",
                    message=f"patch spec {spec.name!r} is for {spec.distribution} "
                    f"{spec.versions}, but {installed} is installed; {spec.distribution} runs "
                    "unpatched",
                    spec=spec.name,
                    reason=f"{spec.distribution} {installed} not in {spec.versions}",
                )
            )
            # "Runs unpatched" includes discovery: the spec's author vouched for other versions.
            leaves.extend(
                Leave(
                    prefix=package,
                    spec=spec.name,
                    why=f"{spec.distribution} {installed} is not covered",
                    quiet=True,
                )
                for package in spec.packages()
            )
            continue
        for rule in spec.rewrites:
            if rule.versions.contains(installed, prereleases=True):
                targets.extend(
                    ModuleTarget(
                        module=module,
                        spec=spec.name,
                        expect_sites=rule.expect_sites,
                        fingerprint=spec.fingerprint,
                    )
                    for module in rule.modules
                )
        for wrap in spec.wraps:
            if wrap.versions.contains(installed, prereleases=True):
                wraps.append(Fix(spec=spec.name, target=wrap.target, fix=wrap.fix, why=wrap.why))
        for alias in spec.aliases:
            if alias.versions.contains(installed, prereleases=True):
                aliases.append(Alias(module=alias.module, target=alias.target, spec=spec.name))
        for leave in spec.leaves:
            if leave.versions.contains(installed, prereleases=True):
                leaves.extend(
                    Leave(prefix=module, spec=spec.name, why=leave.why, quiet=False)
                    for module in leave.modules
                )
    for pack, message, reason in loading.skipped_packs():
        warnings.append(SpecWarning(key=f"pack:{pack}", message=message, spec=pack, reason=reason))
    for name in loading.unmatched_disabled():
        warnings.append(
            SpecWarning(
                key=f"disable:{name}",
                message=f"{DMLPATCH_DISABLE_PATCHES} names {name!r}, but no patch spec or pack has "
                "that name (see dmlpatch list); it disables nothing",
                spec=name,
                reason=f"named in {DMLPATCH_DISABLE_PATCHES}, but no such spec or pack",
            )
        )
    inputs.extend(str(directory) for directory in loading.spec_directories())
    # Stored as plain tuples: marshal writes no named tuples (and needs no import to read them).
    return {
        "layout": layout(),
        "targets": [tuple(entry) for entry in targets],
        "wraps": [tuple(entry) for entry in wraps],
        "aliases": [tuple(entry) for entry in aliases],
        "leaves": [tuple(entry) for entry in leaves],
        "warnings": [tuple(entry) for entry in warnings],
        "inputs": [[path, *_stat(path)] for path in dict.fromkeys(inputs)],
    }


def _cache_file() -> tuple[str, Optional[str]]:
    key = repr(
        (
            __version__,
            sys.version_info[:2],
            sys.path,
            os.environ.get(DMLPATCH_PATCHES, ""),
            os.environ.get(DMLPATCH_DISABLE_PATCHES, ""),
        )
    )
    # The tag names the file; the key itself is stored and compared, so a collision only misses.
    name = f"{file_tag(key)}.plan"
    directory = cache_subdirectory("plans", create=False)
    return key, os.path.join(directory, name) if directory is not None else None


def _stat(path: str) -> list[int]:
    try:
        status = os.stat(path)
    except OSError:
        return [-1, -1]
    return [status.st_mtime_ns, status.st_size]


def _read(path: str, key: str) -> Optional[dict[str, Any]]:
    from dmlpatch import trust

    data = trust.read(path)
    if data is None:
        return None
    try:
        plan = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return None
    if not _well_formed(plan) or plan.get("layout") != layout() or plan["key"] != key:
        return None
    for entry in plan["inputs"]:
        if _stat(entry[0]) != entry[1:]:
            return None
    return plan


def _well_formed(plan: object) -> bool:
    """Whether ``plan`` has every section, each entry of its record's length and field types."""
    if not isinstance(plan, dict) or not isinstance(plan.get("key"), str):
        return False
    for section, types in FIELD_TYPES.items():
        entries = plan.get(section)
        if not isinstance(entries, list):
            return False
        for entry in entries:
            if not isinstance(entry, tuple) or len(entry) != len(types):
                return False
            # bool is an int: an int field must not hold one, a bool field must hold one.
            if any(type(value) is not kind for value, kind in zip(entry, types)):
                return False
    inputs = plan.get("inputs")
    return isinstance(inputs, list) and all(
        isinstance(entry, list)
        and len(entry) == 3
        and isinstance(entry[0], str)
        and type(entry[1]) is int
        and type(entry[2]) is int
        for entry in inputs
    )


def _write(path: str, plan: dict[str, Any]) -> None:
    """Atomically; a cache that cannot be written is simply not used."""
    from dmlpatch import atomic

    if cache_subdirectory("plans") is None:
        return
    try:
        atomic.write(path, marshal.dumps(plan), mode=0o600)
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
