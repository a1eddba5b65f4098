"""Turning patch specs into an installed import hook and pending function wrappers."""

from __future__ import annotations

import os
from typing import Optional

from dmlpatch import aliases, hook, log, report, resolution, specs, wrapping
from dmlpatch._metadata import version_of

DISABLE_VAR = "DMLPATCH_DISABLE"

_active = False


def disabled() -> bool:
    return os.environ.get(DISABLE_VAR) == "1"


def patches_needed() -> bool:
    """Decided when the first target is imported: a usable CUDA GPU needs no patches."""
    return resolution.current().patches_needed


def activate(device: Optional[str] = None) -> bool:
    """Install every spec that matches an installed library; False when switched off.

    Nothing is imported here but the specs and package metadata: each target is patched when
    it is imported. Raises :class:`~dmlpatch.errors.SpecError` for a malformed spec.
    """
    global _active
    if disabled():
        log.info(f"{DISABLE_VAR}=1: patches are off in this process")
        return False
    if device is not None:
        resolution.configure(device)
    for spec in specs.load_all():
        installed = version_of(spec.distribution)
        if installed is None:
            continue
        if not spec.versions.contains(installed, prereleases=True):
            log.warn_once(
                f"version:{spec.name}",
                f"patch spec {spec.name!r} is for {spec.distribution} {spec.versions}, but "
                f"{installed} is installed; {spec.distribution} runs unpatched",
            )
            report.record_skip(
                spec.name, None, f"{spec.distribution} {installed} not in {spec.versions}"
            )
            continue
        targets = [
            hook.ModuleTarget(module, spec.name, rule.expect_sites, spec.fingerprint)
            for rule in spec.rewrites
            if rule.versions.contains(installed, prereleases=True)
            for module in rule.modules
        ]
        wraps = [rule for rule in spec.wraps if rule.versions.contains(installed, prereleases=True)]
        hook.install(targets)
        wrapping.apply(spec, wraps, gate=patches_needed)
        for alias in spec.aliases:
            if alias.versions.contains(installed, prereleases=True):
                aliases.install(alias.module, alias.target, spec.name)
    hook.set_gate(patches_needed)
    _active = True
    return True


def deactivate() -> None:
    """Remove the import hook and restore every wrapped function."""
    global _active
    hook.uninstall()
    wrapping.unwrap_all()
    aliases.uninstall()
    _active = False


def is_active() -> bool:
    return _active
