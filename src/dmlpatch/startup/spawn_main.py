"""The program's main script, rewritten again in multiprocessing *spawn* children.

A spawn child (``torch.multiprocessing.spawn``, DDP ranks, Windows DataLoader workers) re-runs
the parent's main script as ``__mp_main__`` with ``runpy`` before calling the target function,
so the function it runs is the one compiled in the child. Without this, a CUDA site inside a
function that only the ranks call (``torch.cuda.set_device(rank)``, ``model.cuda(rank)``) would
run unrewritten there. The runner names the rewritten script in ``$DMLPATCH_MAIN``; the child's
start-up replaces multiprocessing's two "fix up main" steps, for that script only.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

from dmlpatch import changes
from dmlpatch.environment_variables import DMLPATCH_MAIN
from dmlpatch.rewriting import hook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_PATH = "path:"
_MODULE = "module:"


def remember_path(path: str) -> None:
    """The parent runs ``path`` rewritten: its spawn children should too."""
    changes.set_environment(DMLPATCH_MAIN, _PATH + os.path.normpath(os.path.abspath(path)))


def remember_module(name: str) -> None:
    """The parent runs module ``name`` rewritten (``python -m dmlpatch -m name``)."""
    changes.set_environment(DMLPATCH_MAIN, _MODULE + name)


def install() -> None:
    """In a child process: rewrite the parent's main script when multiprocessing re-runs it."""
    if os.environ.get(DMLPATCH_MAIN):
        hook.when_imported("multiprocessing.spawn", _patch)


def uninstall() -> None:
    """Undo :func:`install`: multiprocessing's own fix-up steps again."""
    hook.forget_when_imported("multiprocessing.spawn", _patch)
    spawn = sys.modules.get("multiprocessing.spawn")
    for name, original in _originals.items():
        if spawn is not None:
            setattr(spawn, name, original)
    _originals.clear()


#: multiprocessing.spawn's functions this module replaced, by name.
_originals: dict[str, Callable[[str], None]] = {}


def _patch(spawn: Any) -> None:
    wanted = os.environ.get(DMLPATCH_MAIN, "")
    from_path: Callable[[str], None] = spawn._fixup_main_from_path
    from_name: Callable[[str], None] = spawn._fixup_main_from_name
    _originals.update(_fixup_main_from_path=from_path, _fixup_main_from_name=from_name)

    def fixup_main_from_path(main_path: str) -> None:
        if wanted != _PATH + os.path.normpath(os.path.abspath(main_path)):
            return from_path(main_path)
        if getattr(sys.modules["__main__"], "__file__", None) == main_path:
            return None  # a forked child already has it
        with open(main_path, "rb") as stream:
            source = stream.read()
        _run_as_mp_main(spawn, source, main_path, None)
        return None

    def fixup_main_from_name(name: str) -> None:
        if wanted != _MODULE + name or name == "__main__" or name.endswith(".__main__"):
            return from_name(name)
        if getattr(sys.modules["__main__"].__spec__, "name", None) == name:
            return None
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return from_name(name)
        with open(spec.origin, "rb") as stream:
            source = stream.read()
        _run_as_mp_main(spawn, source, spec.origin, spec)
        return None

    spawn._fixup_main_from_path = fixup_main_from_path
    spawn._fixup_main_from_name = fixup_main_from_name


def _run_as_mp_main(spawn: Any, source: bytes, filename: str, spec: Optional[Any]) -> None:
    """What ``runpy.run_path(..., run_name='__mp_main__')`` does, with the rewritten code."""
    code = hook.compile_main(source, filename)
    module = types.ModuleType("__mp_main__")
    module.__file__ = filename
    module.__spec__ = spec
    module.__package__ = spec.parent if spec is not None else None
    module.__loader__ = spec.loader if spec is not None else None
    spawn.old_main_modules.append(sys.modules["__main__"])
    previous = sys.modules.get("__mp_main__")
    argv0 = sys.argv[0] if sys.argv else None
    sys.modules["__mp_main__"] = module
    if sys.argv:
        sys.argv[0] = filename
    try:
        exec(code, module.__dict__)
    except BaseException:
        if previous is not None:
            sys.modules["__mp_main__"] = previous
        raise
    finally:
        if argv0 is not None:
            sys.argv[0] = argv0
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
