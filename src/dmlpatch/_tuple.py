"""``typing.NamedTuple`` for the modules every process imports at start-up.

``typing`` imports ``re`` and ``enum``: about 12 ms of start-up on a slow machine, paid by every
Python process of an activated environment. The same class syntax builds a
``collections.namedtuple`` here (fields from the annotations, defaults from their values, the
rest of the body as attributes), which is what ``typing.NamedTuple`` builds too; type checkers
are shown ``typing.NamedTuple`` instead (``if TYPE_CHECKING:`` in the importing module).
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_NOT_COPIED = frozenset({"__module__", "__qualname__", "__annotations__", "__dict__"})


class _NamedTupleMeta(type):
    def __new__(
        cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]
    ) -> Any:  # a namedtuple class, as typing.NamedTuple returns
        if not bases:
            return super().__new__(cls, name, bases, namespace)
        fields = list(namespace.get("__annotations__", {}))
        defaults = [namespace[field] for field in fields if field in namespace]
        if defaults and any(field not in namespace for field in fields[-len(defaults) :]):
            raise TypeError(f"{name}: fields without a default follow fields with one")
        build: Any = collections.namedtuple  # fields known only at run time
        made = build(name, fields, defaults=defaults, module=namespace.get("__module__"))
        made.__qualname__ = namespace.get("__qualname__", name)
        for key, value in namespace.items():
            if key not in _NOT_COPIED and key not in fields:
                setattr(made, key, value)
        return made


class NamedTuple(metaclass=_NamedTupleMeta):
    """Subclass it with annotated fields, as ``typing.NamedTuple``."""
