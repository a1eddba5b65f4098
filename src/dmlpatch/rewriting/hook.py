"""The import hook: modules load with their CUDA device sites rewritten.

A finder first on ``sys.meta_path`` answers for the modules the patch specs name (*targets*) and,
when discovery is on, for every other module in its scope (``dmlpatch.rewriting.discovery``); any
other import costs a dict lookup and a name check and goes on its normal path. For a module it
answers, it asks the finders behind it for the spec (``PathFinder``, editable-install finders) and,
when that is a plain ``.py`` source with sites, swaps in a ``SourceFileLoader`` subclass that
rewrites before compiling and keeps the result in a bytecode cache of its own
(``dmlpatch.rewriting.bytecode_cache``). The spec's origin and the code's filename stay the original
path, so ``__file__``, tracebacks, ``inspect.getsource`` and ``linecache`` point at the original
source.

The model is typeguard's ``_importhook``; the cache follows pytest's assertion rewriter.
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import atexit
import importlib.machinery
import os
import sys
import time
import types

from dmlpatch import log, record
from dmlpatch.rewriting.rules import may_have_sites
from dmlpatch.runtime import SITES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from importlib.abc import Loader as _LoaderInterface
    from typing import Any, Callable, NamedTuple, Optional, Union

    from dmlpatch.rewriting.composition import Composer
    from dmlpatch.rewriting.discovery import Discovery
    from dmlpatch.rewriting.transform import Site
else:
    from dmlpatch._tuple import NamedTuple

    # The loader interface the checker sees; importlib.abc costs milliseconds to import.
    _LoaderInterface = object

MAIN_SPEC = record.MAIN
DISCOVERED = record.DISCOVERED


class ModuleTarget(NamedTuple):
    """A module whose CUDA sites a patch spec rewrites."""

    module: str  # dotted module name, e.g. "facexlib.detection.retinaface"
    spec: str  # patch spec name, e.g. "facexlib"
    expect_sites: int  # fewer found => the spec is stale: warn, load the module unrewritten
    fingerprint: str  # hash of the spec's content; part of the bytecode cache tag
    # What its sites call (see dmlpatch.runtime.as_written).
    runtime: str = SITES
    # The program's own code (see dmlpatch.rewriting.transform.rewrite).
    program: bool = False


_lock = _thread.allocate_lock()
_targets: dict[str, ModuleTarget] = {}
_gate: Optional[Callable[[], bool]] = None
_watched: dict[str, list[Callable[[types.ModuleType], None]]] = {}
_rewritten: set[str] = set()  # modules this hook loaded (and so rewrote)
_discovery: Optional[Discovery] = None


#: Whether the device is already known to need no patches (a usable CUDA GPU). Discovery asks
#: it instead of the gate, because answering the gate imports torch, and discovery sees modules
#: that load while torch itself is being imported.
def _never() -> bool:
    return False


_known_unneeded: Callable[[], bool] = _never


def install(targets: Iterable[ModuleTarget]) -> None:
    """Add ``targets`` and put the finder first on ``sys.meta_path`` (idempotent)."""
    with _lock:
        for target in targets:
            if _targets.get(target.module) == target:
                continue
            _targets[target.module] = target
            if target.module in sys.modules and target.module not in _rewritten:
                _imported_too_early(target)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def when_imported(module: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Call ``callback(module)`` right after ``module`` is executed, or now if it already was.

    wrapt's ``register_post_import_hook`` does the same, but importing wrapt costs tens of
    milliseconds in every process of an activated environment; here it costs a dict lookup.
    """
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__spec__", None) is not None:
        initializing = getattr(loaded.__spec__, "_initializing", False)
        if not initializing:
            callback(loaded)
            return
    with _lock:
        _watched.setdefault(module, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def forget_when_imported(module: str, callback: Callable[[types.ModuleType], None]) -> None:
    """Undo :func:`when_imported` for a module not imported yet (one already imported has had
    its call)."""
    with _lock:
        waiting = _watched.get(module, [])
        if callback in waiting:
            waiting.remove(callback)
        if not waiting:
            _watched.pop(module, None)


def discover(discovery: Optional[Discovery], known_unneeded: Callable[[], bool]) -> None:
    """Rewrite modules in ``discovery``'s scope too (None: only targets)."""
    global _discovery, _known_unneeded
    with _lock:
        _discovery = discovery
        _known_unneeded = known_unneeded
        if discovery is not None and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Remove the finder and forget the targets; modules already loaded stay as they are."""
    global _gate, _discovery
    with _lock:
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _targets.clear()
        _watched.clear()
        _gate = None
        _discovery = None


def is_installed() -> bool:
    return _finder in sys.meta_path


def targets() -> dict[str, ModuleTarget]:
    """A copy of the target set, by module name."""
    return dict(_targets)


def set_gate(gate: Optional[Callable[[], bool]]) -> None:
    """A check made when a target is imported: False loads it unrewritten (say, usable CUDA).

    It is called lazily because answering it may import torch.
    """
    global _gate
    _gate = gate


def compile_main(source: bytes, filename: str) -> types.CodeType:
    """Rewrite and compile the program's ``__main__`` script (no stale check, no cache)."""
    if not may_have_sites(source, program=True):  # the rewriter costs milliseconds to load
        return compile(source, filename, "exec", dont_inherit=True)
    from dmlpatch.rewriting.transform import rewrite

    result = rewrite(source, filename, program=True)
    if not result.sites:
        return compile(source, filename, "exec", dont_inherit=True)
    if _gate is not None and not _gate():
        return compile(source, filename, "exec", dont_inherit=True)
    record.record_rewrite(MAIN_SPEC, MAIN_SPEC, len(result.sites), False)
    log.info(f"rewrote {len(result.sites)} CUDA site(s) in {filename}")
    return compile(result.tree, filename, "exec", dont_inherit=True)


class _Finder:
    """A meta path finder (only ``find_spec`` is needed; ``importlib.abc`` costs ~10 ms)."""

    def __init__(self) -> None:
        # Names being looked up behind us, in case a finder there calls back into the import
        # system for the same name (the module's import lock keeps other threads out).
        self._searching: set[str] = set()

    def find_spec(
        self,
        fullname: str,
        path: Optional[Sequence[str]] = None,
        target: Optional[types.ModuleType] = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        meta_path = sys.meta_path
        if meta_path and meta_path[0] is not self:
            to_front()  # another tool's finder went in front (see composition)
        entry = _targets.get(fullname)
        watchers = _watched.get(fullname)
        discovery = _discovery if entry is None else None
        if discovery is not None and not discovery.may_cover(fullname):
            discovery = None
        if (entry is None and watchers is None and discovery is None) or (
            fullname in self._searching
        ):
            return None
        if entry is not None and _gate is not None and not _gate():
            entry = None
        spec = self._spec_behind(fullname, path, target)
        if spec is None:
            return None
        loader = spec.loader
        # Only a .py source can be rewritten: extension modules, sourceless pycs, zips and
        # namespace packages are left alone.
        source = spec.origin if spec.origin and spec.origin.endswith(".py") else None
        found: Optional[ModuleTarget] = None
        if source is None or loader is None:
            pass
        elif entry is not None:
            found = entry
        elif discovery is not None and not _known_unneeded():
            runtime = discovery.decide(fullname, source)
            if runtime is not None:
                program = discovery.is_program(fullname, source)
                found = ModuleTarget(fullname, DISCOVERED, 0, runtime, runtime, program)
        if found is not None and source is not None:
            if type(loader) is importlib.machinery.SourceFileLoader:
                spec.loader = _RewritingLoader(fullname, source, found)
            else:  # another tool's loader (pytest's, typeguard's...)
                from dmlpatch.rewriting import composition

                composer = composition.composer_for(loader)
                if composer is None:
                    composition.taken(fullname, loader)
                else:
                    spec.loader = _RewritingLoader(fullname, source, found, composer)
        if watchers is not None and spec.loader is not None:
            spec.loader = _NotifyingLoader(spec.loader)
        return spec

    def _spec_behind(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType]
    ) -> Optional[importlib.machinery.ModuleSpec]:
        """What the rest of ``sys.meta_path`` would find for ``fullname``."""
        self._searching.add(fullname)
        try:
            finders = list(sys.meta_path)
            start = finders.index(self) + 1 if self in finders else 0
            for finder in finders[start:]:
                find_spec = getattr(finder, "find_spec", None)
                spec = find_spec(fullname, path, target) if find_spec is not None else None
                if spec is not None:
                    return spec
            return None
        finally:
            self._searching.discard(fullname)


class _NotifyingLoader(_LoaderInterface):
    """Delegates to the real loader, then runs the callbacks waiting for the module."""

    dmlpatch_loader = True

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            callbacks = _watched.pop(module.__name__, [])
        for callback in callbacks:
            callback(module)


class _RewritingLoader(importlib.machinery.SourceFileLoader):
    """Rewrites, then compiles, through ``composer`` where another tool's rewrite follows."""

    dmlpatch_loader = True

    def __init__(
        self, fullname: str, path: str, target: ModuleTarget, composer: Optional[Composer] = None
    ) -> None:
        super().__init__(fullname, path)
        self.target = target
        self.composer = composer

    def get_code(self, fullname: str) -> types.CodeType:
        # Imported here, not at the top: the .pth bootstrap imports this module in every
        # process, and only processes that load a target need the rewriter and the cache.
        from dmlpatch.rewriting import bytecode_cache, freshness

        source_path = self.get_filename(fullname)
        target = self.target
        status = os.stat(source_path)
        stamp = (status.st_mtime_ns, status.st_size)
        fingerprint = target.fingerprint
        if self.composer is not None:
            fingerprint = f"{fingerprint}+{self.composer.tag}"
        cache_path = (
            bytecode_cache.location(
                source_path, bytecode_cache.tag(fingerprint, target.expect_sites, target.runtime)
            )
            if self.composer is None or self.composer.tag is not None
            else None
        )
        source: Optional[bytes] = None
        checked_hash: Optional[bytes] = None
        if cache_path is not None and freshness.checks_hash(source_path):
            source = self.get_data(source_path)
            checked_hash = freshness.source_hash(source)
        hit = (
            bytecode_cache.read(cache_path, source_path, stamp, checked_hash, status.st_uid)
            if cache_path is not None
            else None
        )
        if hit is not None:
            code, sites = hit
        else:
            started = time.perf_counter()
            if source is None:
                source = self.get_data(source_path)
            code, sites = self._rewrite_and_compile(source, source_path)
            if cache_path is not None and not sys.dont_write_bytecode:
                source_hash = checked_hash or freshness.source_hash(source)
                bytecode_cache.write(cache_path, stamp, source_hash, code, sites, status.st_mode)
            from dmlpatch.rewriting import preparation

            preparation.charge(fullname, time.perf_counter() - started)
        _account(target, sites, cached=hit is not None)
        _rewritten.add(fullname)
        return code

    def source_to_code(
        self, data: Any, path: Any = "<string>", *, _optimize: int = -1
    ) -> types.CodeType:
        """Rewrite, then compile: for callers that compile a source by hand (no cache).

        The signature is both of the stdlib's: ``InspectLoader``'s static one and
        ``SourceLoader``'s, with ``_optimize``; any buffer or path-like they accept is taken.
        """
        source = data if isinstance(data, (bytes, str)) else bytes(data)
        name = os.fsdecode(path) if not isinstance(path, str) else path
        return self._rewrite_and_compile(source, name)[0]

    def _rewrite_and_compile(
        self, data: Union[bytes, str], path: str
    ) -> tuple[types.CodeType, list[Site]]:
        from dmlpatch.rewriting.transform import RUNTIME_MODULE, rewrite

        result = None
        discovery = sys.modules.get("dmlpatch.rewriting.discovery")
        if (
            discovery is not None
            and isinstance(data, bytes)
            and self.target.runtime == (RUNTIME_MODULE)
        ):
            result = discovery.take_rewrite(path, data)  # examined a moment ago: not again
        if result is None:
            result = rewrite(data, path, self.target.runtime, self.target.program)
        if self.composer is not None:
            tree = result.tree
            if result.sites and len(result.sites) < self.target.expect_sites:
                import ast

                tree = ast.parse(data, path)  # stale: as written, then the other tool's rewrite
            source = data.encode("utf-8") if isinstance(data, str) else data
            return self.composer.finish(tree, source, path), result.sites
        if not result.sites or len(result.sites) < self.target.expect_sites:
            # Stale spec: the rewritten tree is not trusted. Without sites the source compiles
            # to the same code, and compiling source is not limited by the recursion depth as
            # compiling a deeply nested tree is.
            return compile(data, path, "exec", dont_inherit=True), result.sites
        return compile(result.tree, path, "exec", dont_inherit=True), result.sites


def to_front() -> None:
    """Put the finder first on ``sys.meta_path`` again, where another tool put its own
    finder in front (``dmlpatch.rewriting.composition``); nothing where it is not installed.

    Safe while the import system iterates ``sys.meta_path``: the finders after the one being
    asked keep their positions.
    """
    with _lock:
        meta_path = sys.meta_path
        if _finder in meta_path and meta_path[0] is not _finder:
            meta_path.remove(_finder)
            meta_path.insert(0, _finder)


def look_for_taken_at_exit(torch: Any = None) -> None:
    """At exit, name the modules with sites another tool's finder loaded out of this finder's
    sight (``composition.look_for_taken``). Registered when torch is imported: sites matter
    only to programs that use it, and by then the report's writer is registered, so this runs
    before it."""
    atexit.register(_look_for_taken)


def _look_for_taken() -> None:
    discovery = _discovery
    if discovery is None and not _targets:
        return
    from dmlpatch.rewriting import composition

    def covers(fullname: str, origin: str) -> bool:
        if fullname in _targets:
            return True
        if discovery is None or not discovery.may_cover(fullname):
            return False
        return discovery.has_sites(fullname, origin)

    composition.look_for_taken(covers)
    composition.say_taken()


def _account(target: ModuleTarget, sites: list[Site], cached: bool) -> None:
    if target.runtime != ModuleTarget._field_defaults["runtime"]:
        return  # kept as written: discovery has said why
    found = len(sites)
    if found < target.expect_sites:
        log.warn_once(
            f"stale:{target.spec}:{target.module}",
            f"patch spec {target.spec!r} expects {target.expect_sites} CUDA site(s) in "
            f"{target.module} but found {found}; the module runs unrewritten (is the installed "
            f"version newer than the spec? update the spec or report it)",
        )
        record.record_skip(
            target.spec,
            target.module,
            f"stale spec: found {found} CUDA site(s), expected {target.expect_sites}",
        )
        return
    record.record_rewrite(target.spec, target.module, found, cached)
    origin = "bytecode cache" if cached else "source"
    log.info(f"rewrote {found} CUDA site(s) in {target.module} ({target.spec}, from {origin})")


def _imported_too_early(target: ModuleTarget) -> None:
    log.warn_once(
        f"early:{target.module}",
        f"{target.module} was imported before dmlpatch, so its CUDA sites cannot be rewritten; "
        f"import dmlpatch (or dmlpatch.auto) before {target.module.partition('.')[0]}, or run "
        f"the program with `python -m dmlpatch`",
    )
    record.record_skip(target.spec, target.module, "imported before the import hook")


_finder = _Finder()
