"""Installed distributions, read from their metadata (never by importing them)."""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Optional

_NORMALIZE = re.compile(r"[-_.]+")


def _metadata() -> Any:
    # importlib.metadata costs ~18 ms to import (email, zipfile, csv): only when needed.
    if sys.version_info >= (3, 10):
        from importlib import metadata
    else:  # Python 3.9's importlib.metadata lacks entry_points(group=...)
        import importlib_metadata as metadata
    return metadata


def version_of(distribution: str) -> Optional[str]:
    """The installed version, from the first ``NAME-VERSION.dist-info`` on ``sys.path``.

    That directory name is what importlib-metadata itself reads first; only a match without a
    version in its name (a legacy ``NAME.egg-info``) goes through importlib-metadata.
    """
    wanted = _NORMALIZE.sub("_", distribution).lower()
    if wanted not in _installed():
        return None
    version = _installed()[wanted]
    if version:
        return version
    metadata = _metadata()
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


_index: Optional[dict[str, str]] = None


def _installed() -> dict[str, str]:
    """Normalized project name -> version ('' when the name carries none); first on path wins."""
    global _index
    if _index is None:
        index: dict[str, str] = {}
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:
                continue
            for name in names:
                for suffix in (".dist-info", ".egg-info"):
                    if name.endswith(suffix):
                        project, _, rest = name[: -len(suffix)].partition("-")
                        version = rest.split("-py", 1)[0] if suffix == ".egg-info" else rest
                        index.setdefault(_NORMALIZE.sub("_", project).lower(), version)
        _index = index
    return _index


def requirement_of(distribution: str, dependency: str) -> Optional[str]:
    """``torch==2.4.1`` when ``distribution`` requires ``dependency`` with that specifier."""
    from packaging.requirements import InvalidRequirement, Requirement

    metadata = _metadata()
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name.lower() == dependency.lower() and requirement.marker is None:
            return f"{requirement.name}{requirement.specifier}"
    return None


def distribution_of(top_level_module: str) -> Optional[str]:
    """The distribution that installs a top-level module (e.g. ``cv2`` -> ``opencv-python``)."""
    metadata = _metadata()
    mapping = getattr(metadata, "packages_distributions", None)
    if mapping is None:
        return None
    names = mapping().get(top_level_module) or []
    return names[0] if names else None


def entry_points(group: str) -> list[Any]:
    return list(_metadata().entry_points(group=group))


def all_distributions() -> list[Any]:
    """Every installed distribution on ``sys.path``, in path order (a library installed in two
    places appears twice, the one that imports first)."""
    return list(_metadata().distributions())
