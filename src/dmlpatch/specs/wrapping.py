"""Function-level fixes: wrappers applied when their target module is imported.

``hook.when_imported`` runs the callback right after the target module finishes executing (or
at once if it already has), before any other module can bind the original with
``from x import f``. A fix has wrapt's signature ``fix(wrapped, instance, args, kwargs)``; the
wrapper that calls it is a plain function (a ``staticmethod`` or ``classmethod`` where the
original was one) carrying the original's name, docstring and signature (``__wrapped__``), so
``inspect``, pickling by name and ``torch.jit.ignore``-style introspection see what they saw.
wrapt itself is not used: importing it costs 35-50 ms, paid by every program that imports
torch. Every wrapper is recorded so :func:`unwrap_all` can put the original back.
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import functools
import sys
import types

from dmlpatch import log, record
from dmlpatch.rewriting import hook

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
    original: Any  # what ``parent.__dict__`` held; None where the attribute was inherited


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
            # Wrapped again after unwrap_all(): the hook already fired for this module.
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
    try:
        fix = _load_fix(rule.fix)
        parent, attribute = _resolve(module, rule.qualname)
        own = _own_attribute(parent, attribute)
        wrapper = _wrapper(own if own is not None else getattr(parent, attribute), parent, fix)
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        log.warn_once(
            f"wrap:{spec_name}:{rule.target}",
            f"patch spec {spec_name!r} cannot wrap {rule.target} ({error}); left unpatched",
        )
        record.record_skip(spec_name, rule.module, f"cannot wrap {rule.target}: {error}")
        return
    setattr(parent, attribute, wrapper)
    with _lock:
        _applied.append(_Applied(rule, parent, attribute, own))
    record.record_wrap(spec_name, rule.target)
    log.info(f"{spec_name}: wrapped {rule.target} ({rule.why})")


def _resolve(module: Any, qualname: str) -> tuple[Any, str]:
    """The object holding the last part of ``qualname``, and that part's name."""
    parent = module
    *path, attribute = qualname.split(".")
    for part in path:
        parent = getattr(parent, part)
    getattr(parent, attribute)  # AttributeError names what is missing
    return parent, attribute


def _own_attribute(parent: Any, attribute: str) -> Any:
    """The attribute as ``parent`` itself stores it (descriptors unbound), or None."""
    try:
        return vars(parent).get(attribute)
    except TypeError:  # no __dict__
        return None


def _wrapper(original: Any, parent: Any, fix: Callable[..., Any]) -> Any:
    """A wrapper calling ``fix(wrapped, instance, args, kwargs)``, bound as wrapt binds it."""
    if isinstance(original, staticmethod):
        return staticmethod(_function_wrapper(original.__func__, fix))
    if isinstance(original, classmethod):
        function = original.__func__

        def class_wrapper(cls: Any, *args: Any, **kwargs: Any) -> Any:
            return fix(types.MethodType(function, cls), cls, args, kwargs)

        return classmethod(functools.update_wrapper(class_wrapper, function))
    if isinstance(parent, type) and isinstance(original, types.FunctionType):

        def method_wrapper(*args: Any, **kwargs: Any) -> Any:
            if not args:  # called on the class with nothing to bind
                return fix(original, None, args, kwargs)
            instance = args[0]
            return fix(types.MethodType(original, instance), instance, args[1:], kwargs)

        return functools.update_wrapper(method_wrapper, original)
    if isinstance(original, type) or not callable(original):
        raise TypeError(f"{original!r} is not a function (a class is wrapped by its __init__)")
    return _function_wrapper(original, fix)


def _function_wrapper(original: Callable[..., Any], fix: Callable[..., Any]) -> Any:
    def function_wrapper(*args: Any, **kwargs: Any) -> Any:
        return fix(original, None, args, kwargs)

    return functools.update_wrapper(function_wrapper, original)


def _load_fix(reference: str) -> Callable[..., Any]:
    import pkgutil  # resolves the "package.module:Qualified.name" form specs use

    target = pkgutil.resolve_name(reference)
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
        if entry.original is None:
            delattr(entry.parent, entry.attribute)  # inherited: the base's own shows again
        else:
            setattr(entry.parent, entry.attribute, entry.original)
        record.record_unwrap(entry.rule.spec, entry.rule.target)


def applied_targets() -> list[str]:
    with _lock:
        return [entry.rule.target for entry in _applied]
