"""Installed distributions, read with importlib-metadata (never by importing them)."""

from __future__ import annotations

import sys
from typing import Optional

if sys.version_info >= (3, 10):
    from importlib import metadata
else:  # Python 3.9's importlib.metadata lacks entry_points(group=...)
    import importlib_metadata as metadata

from packaging.requirements import InvalidRequirement, Requirement


def version_of(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def requirement_of(distribution: str, dependency: str) -> Optional[str]:
    """``torch==2.4.1`` when ``distribution`` requires ``dependency`` with that specifier."""
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


def entry_points(group: str) -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=group))
