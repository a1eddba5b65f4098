"""Turning patch specs into an installed import hook and pending function wrappers."""

from __future__ import annotations

import os
from typing import Optional

from dmlpatch import aliases, hook, log, plan, report, resolution, wrapping

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
    chosen = plan.load()
    for key, message, spec_name, reason in chosen["warnings"]:
        log.warn_once(key, message)
        report.record_skip(spec_name, None, reason)
    hook.install(hook.ModuleTarget(*target) for target in chosen["targets"])
    wrapping.apply([wrapping.Fix(*fix) for fix in chosen["wraps"]], gate=patches_needed)
    for module, target, spec_name in chosen["aliases"]:
        aliases.install(module, target, spec_name)
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
