"""Other import hooks that rewrite code, composed with dmlpatch's.

pytest rewrites the asserts of ``conftest.py`` and test modules with a finder it puts first on
``sys.meta_path`` when a session starts; typeguard's and jaxtyping's ``install_import_hook`` put
theirs first too, and beartype's claw swaps the loader ``PathFinder`` hands out. A module such a
hook loads never reached dmlpatch's finder, so its device choices stayed as under plain python,
silently. Now dmlpatch's finder goes back to the front whenever it finds another finder there
(and right after pytest, typeguard or jaxtyping install theirs), asks the finders behind it for
the spec as before, and when a module with sites comes with another tool's loader:

- a loader registered with :func:`register` (pytest's ``AssertionRewritingHook``, by
  ``dmlpatch.pytest_plugin``): dmlpatch rewrites the sites, then the other tool rewrites the
  same tree (pytest's ``rewrite_asserts``), compiled once and cached under a tag naming both;
- typeguard's ``TypeguardLoader``, whose ``source_to_code`` takes a tree as well as source:
  it is handed dmlpatch's tree (not cached by dmlpatch: typeguard's output is its own);
- any other loader (jaxtyping's and beartype's parse the source themselves): the module loads
  as that hook has it, its sites as under plain python; the report lists it under
  ``kept_as_written``, and one line at exit names them all.

A hook installed in front by a means not watched here, just before it imports its own modules,
is not seen at import; at exit :func:`look_for_taken` finds the modules it loaded among those
in ``sys.modules``.
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import importlib.machinery
import sys

from dmlpatch import log, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    import types
    from typing import Any, Callable, NamedTuple, Optional
else:
    from dmlpatch._tuple import NamedTuple


class Composer(NamedTuple):
    """How another tool's rewrite follows dmlpatch's on one module's tree."""

    #: Part of the bytecode cache key (the tool and what its output depends on); None: the
    #: result is not cached by dmlpatch.
    tag: Optional[str]
    #: ``finish(tree, source, path)``: the other tool's rewrite of dmlpatch's tree, compiled.
    finish: Callable[[ast.Module, bytes, str], types.CodeType]


_lock = _thread.allocate_lock()
#: Loader class (module and qualified name) -> the composer for one of its instances.
_composers: dict[str, Callable[[Any], Optional[Composer]]] = {}
#: Modules with sites another loader took: module -> that loader's class name.
_taken: dict[str, str] = {}

#: Functions that put another tool's finder first on ``sys.meta_path``, by module.
INSTALLERS = {
    "typeguard._importhook": "install_import_hook",
    "jaxtyping._import_hook": "install_import_hook",
}


def register(loader_class: str, composer_for: Callable[[Any], Optional[Composer]]) -> None:
    """Compose with loaders of ``loader_class`` (``"module.QualName"``) from now on."""
    with _lock:
        _composers[loader_class] = composer_for


def class_name(loader: Any) -> str:
    kind = type(loader)
    return f"{kind.__module__}.{kind.__qualname__}"


def composer_for(loader: Any) -> Optional[Composer]:
    """The composer for another tool's ``loader``, or None when dmlpatch cannot compose."""
    make = _composers.get(class_name(loader))
    return make(loader) if make is not None else None


def _typeguard(loader: Any) -> Composer:
    # TypeguardLoader.source_to_code is a staticmethod that takes an ast.Module as it is.
    def finish(tree: ast.Module, source: bytes, path: str) -> types.CodeType:
        return loader.source_to_code(tree, path)

    return Composer(None, finish)


_composers["typeguard._importhook.TypeguardLoader"] = _typeguard


def taken(module: str, loader: Any) -> None:
    """``module`` has sites but another tool's loader, which dmlpatch cannot compose with,
    loads it: listed in the report now, said at exit (:func:`say_taken`)."""
    name = class_name(loader)
    with _lock:
        if module in _taken:
            return
        _taken[module] = name
    record.record_skip(
        record.DISCOVERED,
        module,
        f"loaded by another import hook ({name}), which dmlpatch cannot compose with",
    )


def say_taken() -> None:
    """One line for every module another loader took, at exit: said earlier, under pytest,
    it would land in a test's captured output."""
    with _lock:
        taken = dict(_taken)
    if not taken:
        return
    loaders = ", ".join(sorted(set(taken.values())))
    log.warn_once(
        "taken",
        f"{len(taken)} module(s) with CUDA sites were loaded by another import hook "
        f"({loaders}), which dmlpatch cannot compose with, so their device choices stayed as "
        f"under plain python: {', '.join(sorted(taken))}",
    )


def taken_modules() -> dict[str, str]:
    """The modules another loader took so far, with that loader's class."""
    with _lock:
        return dict(_taken)


def watch_installers(
    when_imported: Callable[[str, Callable[[types.ModuleType], None]], None],
    to_front: Callable[[], None],
) -> None:
    """After each function of :data:`INSTALLERS` runs, call ``to_front`` (dmlpatch's finder
    goes back in front of the finder it installed). ``when_imported`` is the import hook's
    (``hook.when_imported``): the hook imports this module, not the other way round."""
    for module in INSTALLERS:
        when_imported(module, lambda loaded: _follow(loaded, to_front))


#: The wrappers :func:`_follow` made, so a module imported twice is wrapped once.
_followers: set[Any] = set()


def _follow(module: types.ModuleType, to_front: Callable[[], None]) -> None:
    import functools

    name = INSTALLERS[module.__name__]
    install = getattr(module, name, None)
    if install is None or install in _followers:
        return

    following = [True]

    @functools.wraps(install)
    def installed_then_in_front(*args: Any, **kwargs: Any) -> Any:
        result = install(*args, **kwargs)
        if following[0]:
            to_front()
        return result

    def unfollow() -> None:
        # A caller that took the wrapper meanwhile (``from typeguard import
        # install_import_hook``) keeps it, now a plain call of the installer.
        following[0] = False
        if getattr(module, name, None) is installed_then_in_front:
            setattr(module, name, install)
        _followers.discard(installed_then_in_front)

    _followers.add(installed_then_in_front)
    setattr(module, name, installed_then_in_front)
    from dmlpatch import changes

    changes.record(
        f"{__name__}:{module.__name__}",
        "function",
        f"{module.__name__}.{name} (dmlpatch's finder back in front after it)",
        unfollow,
    )


#: The standard library's loaders: nothing another tool did.
_PLAIN_LOADERS = frozenset(
    {
        importlib.machinery.SourceFileLoader,
        importlib.machinery.SourcelessFileLoader,
        importlib.machinery.ExtensionFileLoader,
        importlib.machinery.BuiltinImporter,
        importlib.machinery.FrozenImporter,
    }
)


def look_for_taken(covers: Callable[[str, str], bool]) -> None:
    """Modules another tool's finder, in front of dmlpatch's, loaded before dmlpatch's finder
    could see them: those with sites (``covers(name, origin)``) are :func:`taken` too."""
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        loader = getattr(spec, "loader", None)
        if loader is None or type(loader) in _PLAIN_LOADERS:
            continue
        origin = getattr(spec, "origin", None)
        if (
            not isinstance(origin, str)
            or not origin.endswith(".py")
            or getattr(loader, "dmlpatch_loader", False)
            or name in _taken
        ):
            continue
        if covers(name, origin):
            taken(name, loader)
