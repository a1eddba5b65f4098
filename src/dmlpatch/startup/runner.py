"""Run a script, a module or a console script exactly as Python would, with patches active.

The model is coverage.py and the standard library's runpy: ``sys.argv``, ``sys.path[0]``,
``__main__``, stdin and the exit code are what ``python script.py`` / ``python -m module``
would give the program; an uncaught exception prints the program's own traceback (no dmlpatch
frames) and exits 1. The main script or module is compiled through the CUDA-site rewriter.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types

from dmlpatch.errors import UsageError
from dmlpatch.rewriting import hook
from dmlpatch.startup import spawn_main

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def check_path(path: str) -> None:
    """Fail before anything runs when ``python path`` would fail to open it."""
    if not os.path.exists(path):
        raise UsageError(f"can't open file {os.path.abspath(path)!r}: no such file or directory")
    if os.path.isdir(path) or _is_zip(path):
        if importlib.machinery.PathFinder.find_spec("__main__", [path]) is None:
            raise UsageError(f"can't find '__main__' module in {os.path.abspath(path)!r}")
    elif not os.access(path, os.R_OK):
        raise UsageError(f"can't open file {os.path.abspath(path)!r}: permission denied")


def check_module(name: str) -> None:
    """Fail early for a missing top-level package, or a dotted name under a plain module.

    Only what can be told without importing: the full lookup (which imports the parents) runs
    when the program starts. A package whose ``__init__`` changes its ``__path__`` could hold
    what the files do not, so a submodule not found on disk is left to that lookup.
    """
    parts = name.split(".")
    if not parts[0]:
        raise UsageError("Relative module names not supported")
    spec = importlib.util.find_spec(parts[0])
    if spec is None:
        raise UsageError(f"No module named {parts[0]}")
    for depth in range(1, len(parts)):
        parent, child = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
        if spec.submodule_search_locations is None:
            raise UsageError(
                f"Error while finding module specification for {name!r} (__path__ attribute "
                f"not found on {parent!r} while trying to find {child!r})"
            )
        spec = importlib.machinery.PathFinder.find_spec(child, spec.submodule_search_locations)
        if spec is None:
            return


def run_path(path: str, args: list[str], rewrite: bool = True) -> None:
    """``python path args...``: a script file, or a directory/zip with ``__main__.py``."""
    check_path(path)
    if os.path.isdir(path) or _is_zip(path):
        sys.argv = [path, *args]
        sys.path[0] = os.path.abspath(path)
        spec = importlib.machinery.PathFinder.find_spec("__main__", [sys.path[0]])
        if spec is None:  # check_path saw a __main__.py: only a race removes it
            raise UsageError(f"can't find '__main__' module in {path!r}")
        _run_spec(spec, rewrite)
        return
    absolute = os.path.abspath(path)
    try:
        with open(absolute, "rb") as stream:
            source = stream.read()
    except OSError as error:
        raise UsageError(f"can't open file {absolute!r}: {error.strerror}") from None
    code = _compile(source, absolute, rewrite)
    if rewrite:
        spawn_main.remember_path(absolute)
    main = _fresh_main(
        __file__=absolute,
        __cached__=None,
        __package__=None,
        __spec__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", absolute),
    )
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(absolute))
    _execute(code, main)


def run_module(name: str, args: list[str], rewrite: bool = True) -> None:
    """``python -m name args...``."""
    sys.argv = [name, *args]
    sys.path[0] = os.getcwd()
    spec = _find_main_spec(name)
    sys.argv[0] = spec.origin or name
    if rewrite:
        spawn_main.remember_module(name)
    _run_spec(spec, rewrite)


def _compile(source: bytes, filename: str, rewrite: bool) -> types.CodeType:
    if rewrite:
        return hook.compile_main(source, filename)
    return compile(source, filename, "exec", dont_inherit=True)


def _run_spec(spec: importlib.machinery.ModuleSpec, rewrite: bool) -> None:
    origin = spec.origin or spec.name
    loader = spec.loader
    source = None
    if isinstance(loader, importlib.machinery.SourceFileLoader) and origin.endswith(".py"):
        source = loader.get_data(origin)
    code: types.CodeType | None
    if source is not None:
        code = _compile(source, origin, rewrite)
    else:
        get_code = getattr(loader, "get_code", None)  # zipimport's loader, among others
        code = get_code(spec.name) if get_code is not None else None
        if code is None:
            raise UsageError(f"No code object available for {spec.name}")
    main = _fresh_main(
        __file__=origin,
        __cached__=spec.cached,
        __package__=spec.parent,
        __spec__=spec,
        __loader__=loader,
    )
    _execute(code, main)


def _find_main_spec(name: str) -> importlib.machinery.ModuleSpec:
    if name.startswith("."):
        raise UsageError("Relative module names not supported")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, AttributeError, ValueError) as error:
        raise UsageError(
            f"Error while finding module specification for {name!r} ({error})"
        ) from None
    if spec is None:
        raise UsageError(f"No module named {name}")
    if spec.submodule_search_locations is not None:
        if name == "__main__" or name.endswith(".__main__"):
            raise UsageError(f"Cannot use package as __main__ module ({name})")
        main_name = f"{name}.__main__"
        try:
            main_spec = importlib.util.find_spec(main_name)
        except ImportError as error:
            raise UsageError(
                f"{error}; {name!r} is a package and cannot be directly executed"
            ) from None
        if main_spec is None:
            raise UsageError(
                f"No module named {main_name}; {name!r} is a package and cannot be "
                "directly executed"
            )
        return main_spec
    return spec


#: The globals python gives a main script or module, in its order (``ModuleType`` makes the
#: first five): ``list(globals())`` and ``__builtins__.len`` must be what they are under python.
_MAIN_GLOBALS = (
    *("__name__", "__doc__", "__package__", "__loader__", "__spec__"),
    *("__annotations__", "__builtins__", "__file__", "__cached__"),
)


def _fresh_main(**attributes: Any) -> types.ModuleType:
    """A ``__main__`` whose globals are python's, name for name: ``__builtins__`` the module
    (an imported module's is its dict), and ``__annotations__`` where this interpreter's own
    ``__main__`` has one."""
    import builtins

    main = types.ModuleType("__main__")
    namespace = main.__dict__
    interpreters = vars(sys.modules.get("__main__", main))
    for name in _MAIN_GLOBALS:
        if name == "__annotations__":
            if name in interpreters:
                namespace[name] = {}
        elif name == "__builtins__":
            namespace[name] = builtins
        elif name in attributes:
            namespace[name] = attributes[name]
    sys.modules["__main__"] = main
    return main


def _execute(code: types.CodeType, main: types.ModuleType) -> None:
    exec(code, main.__dict__)


def _is_zip(path: str) -> bool:
    if path.endswith(".py") or not os.path.isfile(path):
        return False
    import zipfile

    return zipfile.is_zipfile(path)


def run_console_script(command: str, args: list[str]) -> Any:
    """``COMMAND args...`` for a console-script entry point of this environment (e.g. ``yolo``)."""
    entry_point = find_console_script(command)
    sys.argv = [command, *args]  # before loading: ultralytics captures sys.argv at import
    return entry_point.load()()


def console_script_name(command: str) -> str:
    """The entry point's name in a command as typed: ``yolo`` for ``yolo``,
    ``.venv/bin/yolo`` and ``C:\\env\\Scripts\\yolo.exe`` (pip's launcher on Windows)."""
    import ntpath  # splits at both separators, on every platform

    name = ntpath.basename(command)
    stem, suffix = os.path.splitext(name)
    return stem if suffix.lower() == ".exe" else name


def find_console_script(command: str) -> Any:
    """The entry point (not yet loaded: loading imports the target library)."""
    from dmlpatch._metadata import entry_points

    name = console_script_name(command)
    for entry_point in entry_points("console_scripts"):
        if entry_point.name == name:
            return entry_point
    raise UsageError(
        f"no console script named {name!r} in this Python environment ({sys.prefix}); "
        "for a script file use: python -m dmlpatch script.py"
    )


def exit_status(value: object) -> int:
    """The process status Python gives an exit value (``sys.exit(value)`` or a return value):
    None is 0, an int is itself, anything else is printed to stderr and is 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    sys.stderr.write(f"{value}\n")
    return 1


def program_traceback(error: BaseException, program_file: str | None) -> Any:
    """The traceback from the program's first frame on, as Python would have printed it.

    A syntax error in the main script or module is raised while compiling it, before any of the
    program's frames exist: Python prints it with no traceback (file, line, caret), so do we.
    """
    tb = error.__traceback__
    cursor = tb if program_file is not None else None
    while cursor is not None:
        if cursor.tb_frame.f_code.co_filename == program_file:
            return cursor
        cursor = cursor.tb_next
    if isinstance(error, SyntaxError) and _compiling_main(tb):
        return None
    return tb


def _compiling_main(tb: Any) -> bool:
    """Whether the traceback ends in compiling the main script (no program frame ran)."""
    while tb is not None:
        if tb.tb_frame.f_code is _compile.__code__:
            return True
        tb = tb.tb_next
    return False


def printed_already(*exc_info: object) -> None:
    """The excepthook for the KeyboardInterrupt whose trimmed traceback was printed."""
