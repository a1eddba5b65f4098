"""The line a backward operator's warning names: the forward call that made its autograd node.

A backward operator runs on autograd's device thread, where no frame of the program is: the
only Python line in sight is the one that called ``backward()``, which says nothing about which
layer needs the CPU. The line that made the operator's node is the one to name (the
``F.pad(x, mode="replicate")`` whose backward DirectML lacks), and autograd keeps it only where
its anomaly mode recorded the forward's stack into each node's metadata.

So the first time a backward operator falls back, the node being run is asked for its forward
stack. Where the program records them (anomaly mode on), the warning names that line at once.
Otherwise it waits: stacks are recorded (anomaly mode, stack only, no NaN checks) until the
operator falls back again, normally in the next training step, and the warning then names the
forward line. Recording costs a stack per autograd node while it lasts; it stops at that
point, or after :data:`MODULE_CALL_BUDGET` module calls, whichever comes first. An operator
that never falls back again is named at exit, at the ``backward()`` line that ran it.
"""

from __future__ import annotations

import atexit
import re
import sys
import threading
import types
import warnings
from typing import Any, NamedTuple, Optional

import torch
from torch.nn.modules import module as _module

from dmlpatch.placement import frames

#: Module calls after which stacks stop being recorded although an operator waits: a few
#: training steps of most models, so a program whose operator fell back once does not pay
#: for recording to its end.
MODULE_CALL_BUDGET = 5000
#: Where a backward pass is driven from: torch's engine call (2.3+) and its callers.
_ENGINE_CALLS = frozenset({"_engine_run_backward", "backward", "grad"})
_PROGRAM_TEXT = frozenset({"<string>", "<stdin>"})
_STACK_ENTRY = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<function>.*)$')


class Line(NamedTuple):
    file: str
    line: int
    module: str
    registry: dict[Any, Any]
    function: str = "?"


_lock = threading.Lock()
#: Operator -> (its warning, the backward() line that ran it first), until named.
_waiting: dict[str, tuple[str, Optional[Line]]] = {}
_recording = False
_hook: Any = None
_module_calls = 0
_registries: dict[str, dict[Any, Any]] = {}


def say(name: str, message: str) -> bool:
    """DirectML's warning for backward operator ``name``, raised on autograd's thread: at the
    forward line that made the running node, when its stack is known. Returns False when it
    waits for one (see the module's docstring): the caller asks again at the next call."""
    node = torch._C._current_autograd_node()
    line = forward_line(node)
    if line is not None:
        warn_at(message, line)
        _named(name)
        return True
    if node is None:
        warn_at_backward(message)  # not inside a node's run: nothing better will be known
        return True
    with _lock:
        if name not in _waiting:
            _waiting[name] = (message, _backward_line())
        if not _recording:
            _start_recording()
    return False


def forward_line(node: Any) -> Optional[Line]:
    """The innermost program (or library) line of the forward stack autograd recorded in
    ``node``'s metadata, if it recorded one."""
    if node is None:
        return None
    try:
        stack = node.metadata.get("traceback_")
    except (AttributeError, RuntimeError):
        return None
    if isinstance(stack, str):
        stack = [stack]
    for entry in reversed(stack or ()):
        match = _STACK_ENTRY.match(str(entry).splitlines()[0]) if entry else None
        if match is None:
            continue
        path = match.group("file")
        if path in _PROGRAM_TEXT or not frames.internal(path):
            return _line_of(path, int(match.group("line")), match.group("function"))
    return None


def forward_stack(node: Any) -> Optional[str]:
    """The forward stack autograd recorded in ``node``'s metadata, formatted as
    :func:`traceback.format_list` formats one, if it recorded one."""
    try:
        stack = node.metadata.get("traceback_") if node is not None else None
    except (AttributeError, RuntimeError):
        return None
    if not stack:
        return None
    return stack if isinstance(stack, str) else "".join(str(entry) for entry in stack)


def warn_at_backward(message: str) -> None:
    """At the program's line that called ``backward()``, found on the thread waiting for the
    engine; where no thread is (or several are), where the warning was raised."""
    line = _backward_line()
    if line is None:
        warnings.warn(message, UserWarning, stacklevel=1)
    else:
        warn_at(message, line)


def _backward_line() -> Optional[Line]:
    me = threading.get_ident()
    callers = []
    for ident, innermost in sys._current_frames().items():
        in_engine = False
        frame: Optional[types.FrameType] = innermost
        while frame is not None and ident != me:
            code = frame.f_code
            if code.co_name in _ENGINE_CALLS and frames.internal(code.co_filename):
                in_engine = True
            elif in_engine and _programs(frame):
                callers.append(frame)
                break
            frame = frame.f_back
    if len(callers) != 1:
        return None
    caller = callers[0]
    return Line(
        caller.f_code.co_filename,
        caller.f_lineno,
        caller.f_globals.get("__name__", "?"),
        caller.f_globals.setdefault("__warningregistry__", {}),
    )


def _programs(frame: Any) -> bool:
    """A frame of the program (or of its library): neither torch's nor dmlpatch's."""
    filename = frame.f_code.co_filename
    return filename in _PROGRAM_TEXT or not frames.internal(filename)


def _line_of(path: str, number: int, function: str) -> Line:
    module = "?"
    for name, loaded in list(sys.modules.items()):
        if getattr(loaded, "__file__", None) == path:
            module = name
            break
    return Line(path, number, module, _registries.setdefault(path, {}), function)


def warn_at(message: str, line: Line) -> None:
    # Without the module's globals: their loader may not give sources (python -c's __main__
    # is "not a built-in module"), and the line is read from the file anyway.
    warnings.warn_explicit(message, UserWarning, line.file, line.line, line.module, line.registry)


def _named(name: str) -> None:
    with _lock:
        _waiting.pop(name, None)
    # The forward that fed this backward pass is recorded: its nodes keep their stacks, so
    # any other waiting operator of this pass is named too.
    _stop_recording()


def _start_recording() -> None:
    global _recording, _hook, _module_calls
    if torch.is_anomaly_enabled():
        return  # the program records stacks itself (and no node had one: nothing to add)
    _recording, _module_calls = True, 0
    torch.set_anomaly_enabled(True, False)
    _hook = _module.register_module_forward_hook(_count_module_call)
    atexit.register(_at_exit)


def _count_module_call(module: Any, inputs: Any, output: Any) -> None:
    global _module_calls
    _module_calls += 1
    if _module_calls >= MODULE_CALL_BUDGET:
        _stop_recording()


def _stop_recording() -> None:
    global _recording, _hook
    with _lock:
        if not _recording:
            return
        _recording = False
        hook, _hook = _hook, None
    if torch.is_anomaly_enabled() and not torch.is_anomaly_check_nan_enabled():
        torch.set_anomaly_enabled(False)
    if hook is not None:
        hook.remove()


def _at_exit() -> None:
    """Operators that never fell back again: named at the backward() line that ran them."""
    _stop_recording()
    with _lock:
        waiting = list(_waiting.values())
        _waiting.clear()
    for message, line in waiting:
        if line is None:
            warnings.warn(message, UserWarning, stacklevel=1)
        else:
            warn_at(message, line)
