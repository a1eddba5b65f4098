"""``typing.NamedTuple`` for the modules every process imports at start-up.

``typing`` imports ``re`` and ``enum``: about 12 ms of start-up on a slow machine, paid by every
Python process of an activated environment. The same class syntax builds a named tuple here
(fields from the annotations, defaults from their values, the rest of the body as attributes)
with the behaviour of what ``typing.NamedTuple`` builds: positional and keyword construction,
defaults, ``_fields``, ``_field_defaults``, ``_make``, ``_replace``, ``_asdict``, ``repr``,
pickling. The class is made without ``collections.namedtuple``, whose ``exec`` of a generated
``__new__`` costs about 50 us per class and a start-up defines nine. Type checkers are shown
``typing.NamedTuple`` instead (``if TYPE_CHECKING:`` in the importing module).
"""

from __future__ import annotations

from operator import itemgetter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

_NOT_COPIED = frozenset({"__module__", "__qualname__", "__annotations__", "__dict__"})
_MISSING: Any = object()


def _named_tuple(name: str, fields: tuple[str, ...], defaults: tuple[Any, ...]) -> Any:
    count = len(fields)
    first_default = count - len(defaults)
    position = {field: i for i, field in enumerate(fields)}

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > count:
            raise TypeError(
                f"{name}() takes {count} positional arguments but {len(args)} were given"
            )
        values = [*args, *([_MISSING] * (count - len(args)))]
        for key, value in kwargs.items():
            i = position.get(key)
            if i is None:
                raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
            if values[i] is not _MISSING:
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            values[i] = value
        for i in range(count):
            if values[i] is _MISSING:
                if i < first_default:
                    raise TypeError(f"{name}() missing required argument {fields[i]!r}")
                values[i] = defaults[i - first_default]
        return tuple.__new__(cls, values)

    def _make(cls: Any, iterable: Iterable[Any]) -> Any:
        made = tuple.__new__(cls, iterable)
        if len(made) != count:
            raise TypeError(f"expected {count} arguments, got {len(made)}")
        return made

    def _replace(self: Any, **kwargs: Any) -> Any:
        made = self._make(map(kwargs.pop, fields, self))
        if kwargs:
            raise ValueError(f"got unexpected field names: {list(kwargs)!r}")
        return made

    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{field}={value!r}" for field, value in zip(fields, self))
        return f"{type(self).__name__}({shown})"

    def _asdict(self: Any) -> dict[str, Any]:
        return dict(zip(fields, self))

    def __getnewargs__(self: Any) -> tuple[Any, ...]:
        return tuple(self)

    namespace: dict[str, Any] = {
        "__slots__": (),
        "__doc__": f"{name}({', '.join(fields)})",
        "__match_args__": fields,
        "_fields": fields,
        "_field_defaults": dict(zip(fields[first_default:], defaults)),
        "__new__": __new__,
        "_make": classmethod(_make),
        "_replace": _replace,
        "__repr__": __repr__,
        "_asdict": _asdict,
        "__getnewargs__": __getnewargs__,
    }
    for i, field in enumerate(fields):
        namespace[field] = property(itemgetter(i), doc=f"Alias for field number {i}")
    return type(name, (tuple,), namespace)


class _NamedTupleMeta(type):
    def __new__(
        cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]
    ) -> Any:  # a named tuple class, as typing.NamedTuple returns
        if not bases:
            return super().__new__(cls, name, bases, namespace)
        fields = tuple(namespace.get("__annotations__", {}))
        defaults = tuple(namespace[field] for field in fields if field in namespace)
        if defaults and any(field not in namespace for field in fields[-len(defaults) :]):
            raise TypeError(f"{name}: fields without a default follow fields with one")
        made = _named_tuple(name, fields, defaults)
        made.__module__ = namespace.get("__module__", made.__module__)
        made.__qualname__ = namespace.get("__qualname__", name)
        for key, value in namespace.items():
            if key not in _NOT_COPIED and key not in fields:
                setattr(made, key, value)
        return made


class NamedTuple(metaclass=_NamedTupleMeta):
    """Subclass it with annotated fields, as ``typing.NamedTuple``."""
