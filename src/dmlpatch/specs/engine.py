"""Turning patch specs into an installed import hook and pending function wrappers."""

from __future__ import annotations

import os
import sys

from dmlpatch import changes, log, record
from dmlpatch.devices import resolution
from dmlpatch.environment_variables import DMLPATCH_DISABLE, DMLPATCH_SCOPE
from dmlpatch.rewriting import composition, discovery, hook
from dmlpatch.rewriting import scope as scopes
from dmlpatch.specs import plan, wrapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Optional


def disabled() -> bool:
    return os.environ.get(DMLPATCH_DISABLE) == "1"


def patches_needed() -> bool:
    """Decided when the first target is imported: a usable CUDA GPU needs no patches."""
    return resolution.current().patches_needed


def rewrite_gate() -> bool:
    """The import hook's question: rewrite unless the device is a usable CUDA GPU.

    Answering resolves the device, which imports torch; that must not happen while torch is
    itself being imported, nor before the program's own ``import torch`` (settings it makes
    first, such as ``OMP_NUM_THREADS``, would be lost). Until then the answer is yes: rewritten
    code asks the runtime, which passes each call through to CUDA where CUDA is usable.
    """
    torch = sys.modules.get("torch")
    if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return True
    return patches_needed()


def known_unneeded() -> bool:
    """Already resolved to a usable CUDA GPU (asks nothing that would import torch)."""
    resolved = resolution.resolved_or_none()
    return resolved is not None and not resolved.patches_needed


def install(device: Optional[str] = None, scope: Optional[str] = None) -> bool:
    """Install every spec that matches an installed library, and discovery in ``scope``
    (default ``$DMLPATCH_SCOPE``, else ``all``); False when switched off.

    Nothing is imported here but the specs and package metadata: each module is patched when
    it is imported. Raises :class:`~dmlpatch.errors.SpecError` for a malformed spec.
    """
    if disabled():
        log.info(f"{DMLPATCH_DISABLE}=1: patches are off in this process")
        return False
    if device is not None:
        resolution.configure(device)
    chosen = plan.load()
    for warning in map(plan.SpecWarning._make, chosen["warnings"]):
        log.warn_once(warning.key, warning.message)
        record.record_skip(warning.spec, None, warning.reason)
    hook.install(map(hook.ModuleTarget._make, chosen["targets"]))
    wrapping.apply(list(map(wrapping.Fix._make, chosen["wraps"])), gate=patches_needed)
    if chosen["aliases"]:  # imported only where a spec has one: most start-ups do not
        from dmlpatch.specs import aliases

        for alias in map(plan.Alias._make, chosen["aliases"]):
            aliases.install(alias.module, alias.target, alias.spec)
    hook.set_gate(rewrite_gate)
    scope = scopes.parse_scope(scope) if scope else scopes.configured_scope()
    changes.set_environment(DMLPATCH_SCOPE, scope)  # children and the report see this scope
    leaves = list(map(discovery.Leave._make, chosen["leaves"]))
    hook.discover(discovery.Discovery(scope, leaves) if scope != "specs" else None, known_unneeded)
    hook.when_imported("torch", _start_placement)
    hook.when_imported("torch._dynamo", _compiling_rewritten_code)
    composition.watch_installers(hook.when_imported, hook.to_front)
    hook.when_imported("torch", hook.look_for_taken_at_exit)
    return True


def uninstall() -> None:
    """Remove the import hook and restore every wrapped function."""
    hook.discover(None, known_unneeded)
    hook.uninstall()
    wrapping.unwrap_all()
    aliases = sys.modules.get("dmlpatch.specs.aliases")
    if aliases is not None:
        aliases.uninstall()


def is_patched() -> bool:
    """Whether this process is patched: the import hook is what every patch hangs on."""
    return hook.is_installed()


def _compiling_rewritten_code(dynamo: ModuleType) -> None:
    """torch.compile may trace rewritten code: its runtime calls become constants there."""
    from dmlpatch.runtime import compiling

    compiling.mark_constant_answers(dynamo)


def _start_placement(torch: ModuleType) -> None:
    """Compute-placement accounting, imported with torch: a start-up does not pay for it."""
    from dmlpatch.placement import session

    session.start(torch)
