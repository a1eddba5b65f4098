"""Function-level fixes: wrapt wrappers applied when their target module is imported.

``hook.when_imported`` runs the callback right after the target module finishes executing (or
at once if it already has), before any other module can bind the original with
``from x import f``. wrapt's ``FunctionWrapper`` keeps names, docstrings, signatures and
descriptors intact. Every wrapper is recorded so :func:`unwrap_all` can put the original back.
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import importlib
import sys

from dmlpatch import hook, log, report

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NamedTuple
else:
    from dmlpatch._tuple import NamedTuple


class Fix(NamedTuple):
    """One ``[[wrap]]`` entry of a spec, as the plan carries it."""

    spec: str
    target: str  # "package.module:Qualified.name"
    fix: str  # "package.module:function"
    why: str

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


class _Applied(NamedTuple):
    rule: Fix
    parent: Any
    attribute: str
    original: Any


_lock = _thread.allocate_lock()
_applied: list[_Applied] = []
_registered: set[tuple[str, str]] = set()
_enabled = False


def _always() -> bool:
    return True


_gate: Callable[[], bool] = _always


def apply(rules: list[Fix], gate: Callable[[], bool]) -> None:
    """Wrap each rule's target when its module is imported; ``gate()`` decides at that moment."""
    global _enabled, _gate
    _enabled = True
    _gate = gate
    for rule in rules:
        key = (rule.spec, rule.target)
        with _lock:
            known = key in _registered
            _registered.add(key)
        if not known:
            hook.when_imported(rule.module, _callback(rule))
        elif rule.module in sys.modules:
            # Re-activation after unwrap_all(): the hook already fired for this module.
            _callback(rule)(sys.modules[rule.module])


def _callback(rule: Fix) -> Callable[[Any], None]:
    def on_import(module: Any) -> None:
        if not _enabled or (not _inside_torch(rule.module) and not _gate()):
            return
        with _lock:
            if any(a.rule == rule for a in _applied):
                return
        _wrap(rule, module)

    return on_import


def _inside_torch(module: str) -> bool:
    # torch imports these while torch itself is being imported, before the device can be
    # resolved (resolving imports torch); their fixes check the device on every call instead.
    return module == "torch" or module.startswith("torch.")


def _wrap(rule: Fix, module: Any) -> None:
    spec_name = rule.spec
    import wrapt

    try:
        fix = _load_fix(rule.fix)
        parent, attribute, original = wrapt.resolve_path(module, rule.qualname)
    except (ImportError, AttributeError) as error:
        log.warn_once(
            f"wrap:{spec_name}:{rule.target}",
            f"patch spec {spec_name!r} cannot wrap {rule.target} ({error}); left unpatched",
        )
        report.record_skip(spec_name, rule.module, f"cannot wrap {rule.target}: {error}")
        return
    wrapper = wrapt.FunctionWrapper(original, fix)
    wrapt.apply_patch(parent, attribute, wrapper)
    with _lock:
        _applied.append(_Applied(rule, parent, attribute, original))
    report.record_wrap(spec_name, rule.target)
    log.info(f"{spec_name}: wrapped {rule.target} ({rule.why})")


def _load_fix(reference: str) -> Callable[..., Any]:
    module_name, _, qualname = reference.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise AttributeError(f"fix {reference} is not callable")
    return target


def unwrap_all() -> None:
    """Restore every wrapped original; hooks still pending become no-ops."""
    global _enabled
    with _lock:
        _enabled = False
        applied = list(reversed(_applied))
        _applied.clear()
    for entry in applied:
        setattr(entry.parent, entry.attribute, entry.original)
        report.record_unwrap(entry.rule.spec, entry.rule.target)


def applied_targets() -> list[str]:
    with _lock:
        return [entry.rule.target for entry in _applied]
