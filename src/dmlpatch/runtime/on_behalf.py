"""Calls the runtime makes on the program's behalf, seen from the program's line.

A rewritten ``torch.load(f)`` or ``torch.cuda.amp.GradScaler()`` is called from a function of
``dmlpatch.runtime``, so a warning torch raises about the caller (``stacklevel=2``: the
``weights_only`` default, a deprecation) named that function's file instead of the program's
line. :func:`call` makes the call through a one-line function compiled as if it stood on the
program's line, in the program's module: the warning then names the line the program wrote,
``warnings``' once-per-location registry is the program's module's, and nothing global changes,
so no other thread's warnings are touched (``warnings.catch_warnings`` would swap the process's
filters). One such function is made per calling line and kept.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

_TEMPLATE = compile("def on_behalf(f, args, kwargs): return f(*args, **kwargs)", "", "exec")
_CODE: types.CodeType = next(c for c in _TEMPLATE.co_consts if isinstance(c, types.CodeType))
#: The program's lines (file, line, module globals' identity) and their one-line functions.
_LINES: dict[tuple[str, int, int], Callable[..., Any]] = {}
_MOST = 4096


def call(function: Callable[..., Any], args: Any, kwargs: Any, depth: int = 2) -> Any:
    """``function(*args, **kwargs)`` as if called from the frame ``depth`` levels up (2: the
    caller of the runtime function that calls this)."""
    frame = sys._getframe(depth)
    code = frame.f_code
    key = (code.co_filename, frame.f_lineno, id(frame.f_globals))
    on_line = _LINES.get(key)
    if on_line is None:
        placed = _CODE.replace(
            co_filename=code.co_filename, co_firstlineno=frame.f_lineno, co_name=code.co_name
        )
        on_line = types.FunctionType(placed, frame.f_globals)
        if len(_LINES) < _MOST:
            _LINES[key] = on_line
    return on_line(function, args, kwargs)
