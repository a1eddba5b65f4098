"""``dmlpatch prepare``: a first run's preparation, done ahead of it and in parallel.

The first run after a library is installed or upgraded examines each module it imports for
CUDA sites (discovery's index) and rewrites and compiles those with sites (the bytecode cache):
seconds for torch + transformers, said in one line while it happens. This command does the
same for every module of the named packages (default: every package of this environment's
site-packages that dmlpatch may rewrite), in several processes, through the very finder and
loader an import uses, so the caches it fills are the ones a run reads. Nothing is imported or
executed: a module is found, examined and compiled, never run.

Each process hands the verdicts it made to this one, which writes each package's index once
(two processes writing one index file would each keep only their own verdicts).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, NamedTuple, Optional

from dmlpatch import log
from dmlpatch.environment_variables import DMLPATCH_DISABLE, DMLPATCH_SCOPE
from dmlpatch.errors import UsageError

#: Modules per task: small enough that a large package spreads over the processes and the
#: progress moves, large enough that a task's start-up is small beside its work.
CHUNK = 48


class Module(NamedTuple):
    fullname: str
    #: Where the finder looks for it: its parent package's directory.
    path: str


def packages_in(directory: str) -> list[str]:
    """The top-level packages and modules of a site-packages ``directory`` (by name)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        full = os.path.join(directory, name)
        if name.endswith(".py") and name[:-3].isidentifier():
            found.append(name[:-3])
        elif name.isidentifier() and os.path.isdir(full) and name != "__pycache__":
            found.append(name)
    return found


def modules_of(top: str, root: str) -> list[Module]:
    """Every ``.py`` module of top-level package (or module) ``top`` found under ``root``."""
    single = os.path.join(root, top + ".py")
    if os.path.isfile(single):
        return [Module(top, root)]
    modules = []
    for directory, subdirectories, files in os.walk(os.path.join(root, top)):
        relative = os.path.relpath(directory, root)
        parts = relative.split(os.sep)
        # A directory that is not a name cannot be imported (test data, "tests-e2e").
        subdirectories[:] = sorted(d for d in subdirectories if d.isidentifier())
        package = ".".join(parts)
        for file in sorted(files):
            if not file.endswith(".py") or not file[:-3].isidentifier():
                continue
            if file == "__init__.py":
                modules.append(Module(package, os.path.dirname(directory)))
            else:
                modules.append(Module(f"{package}.{file[:-3]}", directory))
    return modules


def site_directories() -> list[str]:
    from dmlpatch.rewriting import discovery

    sites, _ = discovery._places()
    seen: list[str] = []
    for prefix in sites:
        directory = prefix.rstrip(os.sep)
        if os.path.isdir(directory) and os.path.realpath(directory) not in map(
            os.path.realpath, seen
        ):
            seen.append(directory)
    return seen


def _named(name: str) -> tuple[str, str]:
    """(top-level name, the directory it is found under) of an installed package."""
    import importlib.util

    if not name.isidentifier():
        raise UsageError(f"dmlpatch prepare: {name!r} is not a package name")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None else None
    if spec is None or origin is None or origin in ("built-in", "frozen"):
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        if not locations:
            raise UsageError(f"dmlpatch prepare: no package {name!r} in this environment")
        return name, os.path.dirname(locations[0])
    if os.path.basename(origin).startswith("__init__."):
        return name, os.path.dirname(os.path.dirname(origin))
    return name, os.path.dirname(origin)


def work(names: list[str]) -> tuple[list[str], list[Module]]:
    """The packages to prepare and their modules, those dmlpatch never rewrites left out."""
    from dmlpatch.rewriting import discovery

    never = discovery.NEVER | getattr(sys, "stdlib_module_names", frozenset()) | {"dmlpatch"}
    if names:
        located = [_named(name) for name in names]
        refused = [top for top, _ in located if top in never]
        if refused:
            raise UsageError(
                f"dmlpatch prepare: {refused[0]} is never rewritten by dmlpatch: nothing to prepare"
            )
    else:
        located = [
            (top, directory)
            for directory in site_directories()
            for top in packages_in(directory)
            if top not in never and not top.startswith("_")
        ]
    packages, modules = [], []
    for top, directory in located:
        found = modules_of(top, directory)
        if found:
            packages.append(top)
            modules.extend(found)
    return packages, modules


# ---- in each process ----


def _start_process(scope: str) -> None:
    from dmlpatch.rewriting import hook, preparation
    from dmlpatch.specs import engine

    preparation.quiet()  # this command says what it does, once, for all its processes
    engine.install(None, scope)
    # A run asks whether its device needs the rewrite (a usable CUDA GPU does not); preparing
    # for the runs to come asks nothing and resolves no device.
    hook.set_gate(None)


def _prepare(chunk: list[Module]) -> tuple[int, int, int, dict[Optional[str], dict[str, Any]]]:
    """(modules examined, rewritten, left as written for an error, the verdicts made)."""
    from dmlpatch.rewriting import hook

    rewritten = failed = 0
    for module in chunk:
        try:
            spec = hook._finder.find_spec(module.fullname, [module.path])
            loader = spec.loader if spec is not None else None
            if isinstance(loader, hook._RewritingLoader):
                loader.get_code(module.fullname)
                rewritten += 1
        except Exception:
            # Python itself could not compile it (a syntax of another version, a broken file):
            # its first import says so, whether or not dmlpatch runs.
            failed += 1
    discovery = hook._discovery
    verdicts = discovery.take_new() if discovery is not None else {}
    return len(chunk), rewritten, failed, verdicts


# ---- the command ----


def main(names: list[str], jobs: Optional[int]) -> int:
    from dmlpatch.rewriting import discovery
    from dmlpatch.rewriting import scope as scopes
    from dmlpatch.specs import engine

    if engine.disabled():
        raise UsageError(
            f"dmlpatch prepare: {DMLPATCH_DISABLE}=1 turns dmlpatch off: nothing to do"
        )
    if jobs is not None and jobs < 1:
        raise UsageError("dmlpatch prepare: --jobs needs a number of processes, 1 or more")
    scope = scopes.configured_scope()
    if scope == "specs":
        log.say(f"prepare: {DMLPATCH_SCOPE}=specs: only the modules patch specs name are prepared")
    packages, modules = work(names)
    if not modules:
        log.say("prepare: no package here that dmlpatch may rewrite: nothing to do")
        return 0
    if sys.dont_write_bytecode:
        log.say(
            "prepare: python writes no bytecode here (PYTHONDONTWRITEBYTECODE or -B): only "
            "discovery's verdicts are kept, and every run rewrites its modules again"
        )
    started = time.perf_counter()
    chunks = [modules[i : i + CHUNK] for i in range(0, len(modules), CHUNK)]
    processes = min(jobs or os.cpu_count() or 1, len(chunks))
    progress = _Progress(len(modules), sys.stderr)
    totals = [0, 0, 0]
    written: dict[Optional[str], dict[str, Any]] = {}
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(processes, initializer=_start_process, initargs=(scope,)) as pool:
        for done in as_completed([pool.submit(_prepare, chunk) for chunk in chunks]):
            examined, rewritten, failed, verdicts = done.result()
            for total, part in zip(range(3), (examined, rewritten, failed)):
                totals[total] += part
            for path, entries in verdicts.items():
                written.setdefault(path, {}).update(entries)
            progress.show(totals[0])
    for path, entries in written.items():
        discovery.merge(path, entries)
    progress.end()
    seconds = time.perf_counter() - started
    kinds = "package" if len(packages) == 1 else "packages"
    broken = f"; {totals[2]} could not be compiled (python says why on import)" if totals[2] else ""
    log.say(
        f"prepared {totals[0]} modules of {len(packages)} {kinds} in {seconds:.1f} s with "
        f"{processes} processes: {totals[1]} rewritten for DirectML, the rest have no CUDA "
        f"site{broken}; the next run starts from the cache"
    )
    return 0


class _Progress:
    """A bar on a terminal; nothing elsewhere (a log gets the last line only)."""

    WIDTH = 30

    def __init__(self, total: int, stream: Any) -> None:
        self.total = total
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)())

    def show(self, done: int) -> None:
        if not self.live:
            return
        filled = done * self.WIDTH // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\rdmlpatch: preparing [{bar}] {done}/{self.total} modules")
        self.stream.flush()

    def end(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()
