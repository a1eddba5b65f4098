"""The one way fixes read the arguments of the call they wrap, by name and with defaults."""

from __future__ import annotations

import inspect
from typing import Any, Callable


def bound_arguments(
    wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> inspect.BoundArguments:
    """``args``/``kwargs`` bound to ``wrapped``'s signature, defaults filled in."""
    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound
