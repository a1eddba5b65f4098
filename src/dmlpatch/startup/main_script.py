"""The program's main script, rewritten under activation and ``import dmlpatch.auto`` too.

The interpreter compiles the main script itself (``python train.py``): no import hook sees it.
The runner compiles it through the rewriter; the other two entry points take over the script
as it starts, run the rewritten code in the real ``__main__`` namespace, and end the process
with the program's own exit status, so the original code never runs a line:

- **activation** (``.pth`` start-up, before the script starts): when ``sys.argv[0]`` is a
  ``.py`` file whose source says ``cuda``, a one-shot trace function waits for the script's
  module frame. At its first event nothing of the script has run and ``sys.path[0]``,
  sitecustomize and every ``.pth`` are in place; the function runs the rewritten script in
  that frame's globals and stops the process. ``python -m pkg.mod`` and console scripts need
  none of this: their modules are imported, so discovery rewrites them.
- ``import dmlpatch.auto``: the script is already running, so it is run again, rewritten, from
  the top, which is only safe when nothing before the import did anything: docstring,
  comments, ``__future__`` and other imports only. Otherwise one line says that the script's
  own CUDA sites stay as written.

An uncaught exception prints the program's traceback without dmlpatch's frames and exits 1, as
python does; ``SystemExit`` passes through, and ``KeyboardInterrupt`` ends the process by SIGINT
after the program's own traceback.
"""

from __future__ import annotations

import os
import sys
import types

from dmlpatch import log
from dmlpatch.rewriting.rules import may_have_sites
from dmlpatch.runtime import ALIAS

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from typing import Any, Callable, Optional


def arm_for_activation() -> Callable[[], None]:
    """Called at start-up: rewrite ``sys.argv[0]`` when it turns out to be the main script.
    Returns what disarms it (where the script has not started)."""
    argv = getattr(sys, "argv", None)
    if not argv or not argv[0].endswith(".py"):
        return _nothing  # -c, -m (imported, so discovery's), the REPL, or no .py script
    path = os.path.abspath(argv[0])
    source = _read(path)
    if source is None or not may_have_sites(source, program=True):
        return _nothing
    previous = sys.gettrace()

    def first_frame(frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_name != "<module>" or frame.f_globals.get("__name__") != "__main__":
            return previous(frame, event, arg) if previous is not None else None
        sys.settrace(previous)
        if os.path.abspath(frame.f_code.co_filename) != path:
            return None  # another main (runpy, an embedded interpreter): leave it alone
        _run_instead(frame.f_globals, source, path)
        return None

    sys.settrace(first_frame)

    def disarm() -> None:
        if sys.gettrace() is first_frame:
            sys.settrace(previous)

    return disarm


def _nothing() -> None:
    """Nothing was armed."""


def take_over_from_auto() -> None:
    """Called by ``import dmlpatch.auto``: rerun the main script rewritten, when it is safe."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or not path.endswith(".py"):
        return
    frame = _main_frame(main)
    if frame is None:
        return  # imported by a module, not by the script itself
    path = os.path.abspath(path)
    source = _read(path)
    if source is None or not may_have_sites(source, program=True):
        return
    from dmlpatch.rewriting.transform import rewrite

    try:
        result = rewrite(source, path, program=True)
    except (SyntaxError, ValueError, RecursionError):
        return
    if not result.sites:
        return
    if not _only_imports_before(result.tree, frame.f_lineno, source):
        log.warn_once(
            "auto-late",
            f"{os.path.basename(path)} runs code before `import dmlpatch.auto` (line "
            f"{frame.f_lineno}), so its own {len(result.sites)} CUDA site(s) stay as written; "
            "make it the first statement, or run: python -m dmlpatch "
            f"{os.path.basename(path)}",
        )
        return
    _run_instead(main.__dict__, source, path)


def _run_instead(namespace: dict[str, Any], source: bytes, path: str) -> None:
    """Run the rewritten script in ``namespace``, then end the process as python would."""
    from dmlpatch.rewriting import hook
    from dmlpatch.startup import runner, spawn_main

    code = hook.compile_main(source, path)
    if ALIAS not in code.co_names:
        return  # no sites, or the device needs none: the original goes on as it is
    spec = namespace.get("__spec__")
    if spec is not None and getattr(spec, "name", None):
        spawn_main.remember_module(spec.name)
    else:
        spawn_main.remember_path(path)
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as error:
        trimmed = runner.program_traceback(error, path)
        sys.excepthook(type(error), error.with_traceback(trimmed), trimmed)
        from dmlpatch.rewriting import missed

        missed.say(error)
        if isinstance(error, KeyboardInterrupt):
            # Python ends an interrupted program by SIGINT once it has shut down; it does so
            # for this one, whose traceback (the program's frames only) is printed already.
            sys.excepthook = runner.printed_already
            raise
        raise SystemExit(1) from None
    raise SystemExit(0)


def _main_frame(main: types.ModuleType) -> Optional[types.FrameType]:
    """The frame running the main script's top level, if it is what imports us."""
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__:
            return frame
        frame = frame.f_back
    return None


def _only_imports_before(tree: ast.Module, line: int, source: bytes) -> bool:
    """Whether every statement before ``line`` is a docstring or an import."""
    import ast

    for index, statement in enumerate(tree.body):
        if statement.lineno >= line:
            return True
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            continue
        if (
            index == 0
            and isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str)
        ):
            continue
        return False
    return True


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except OSError:
        return None
