"""Discovery: which modules get their CUDA device sites rewritten without a spec naming them.

A patch spec names the modules of one library; real programs are cloned repositories with many
modules and libraries nobody wrote a spec for. So the import hook asks this module about every
module it sees, under a *scope* (``--scope`` / ``$DMLPATCH_SCOPE``):

- ``all`` (default): every module loaded from a ``.py`` source, except the standard library,
  torch and the libraries built with it (their CUDA code is CUDA support itself, not a device
  choice), dmlpatch, and the modules a spec marks ``[[leave]]``;
- ``project``: only the program's own modules, i.e. those outside the standard library and
  site-packages (the script's tree, ``PYTHONPATH``, editable installs);
- ``specs``: none; only the modules specs name (and the main script) are rewritten.

Cost. Whether a module is in scope is told from its name and path, without I/O. Whether it has
sites is a :class:`Verdict` computed once per version of its source: a source without any of
the words a site holds (``rules.may_have_sites``) is never parsed, and verdicts are kept in one
index file per top-level package under ``<cache>/discovery``, each valid for one
``(mtime_ns, size)`` of its source, and for one source hash where python checks that module's
bytecode by hash (``dmlpatch.rewriting.freshness``). A warm process pays one ``stat`` per
module in scope and one read of the ``.pyc`` header; new verdicts are written once, at exit.
An index is read only from a file of this user's (``dmlpatch.trust``), and an entry of any
other shape than the one written is a miss.

First do no harm, per function. A function whose sites would say "CUDA is available" but which
also uses a ``torch.cuda`` name the runtime does not answer (``jiterator``, ``nccl``...) would
fail where plain python ran on the CPU. The rewriter routes that function's sites to
``dmlpatch.runtime.as_written``, which does what the CUDA calls did and, when the
function asks whether CUDA is available, says in one line that it stays where plain python puts
it; the rest of the module is rewritten. The report lists each such function under
``kept_as_written``.
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import atexit
import marshal
import os
import sys
import time

from dmlpatch.paths import cache_subdirectory, file_tag
from dmlpatch.record import DISCOVERED
from dmlpatch.rewriting import freshness
from dmlpatch.rewriting.rules import GENERATION, may_have_sites
from dmlpatch.runtime import SITES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple, Optional
else:
    from dmlpatch._tuple import NamedTuple

#: Top-level packages never rewritten by discovery: torch, the libraries built with it and
#: triton (the kernel compiler CUDA builds of torch ship) call CUDA to *be* CUDA support
#: (streams, kernels, graphs, NCCL); dmlpatch is the rewriter.
NEVER = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torch_directml",
        "torchgen",
        "functorch",
        "triton",
        "dmlpatch",
    }
)

#: The index format: verdicts are valid for one generation of the rewriter's rules.
_FORMAT = (2, GENERATION)
#: Index files kept: one per top-level package and place, so a few hundred cover many
#: environments; older ones (deleted trees, old environments) are pruned.
_KEEP = 512


class Verdict(NamedTuple):
    """What rewriting a source would find: its site count, the unanswered CUDA names, and the
    functions that keep CUDA's meaning for them (``sites.Rewritten.kept``)."""

    sites: int
    unanswered: tuple[str, ...]
    kept: tuple[tuple[str, tuple[str, ...]], ...] = ()


class Leave(NamedTuple):
    """Modules a spec keeps discovery out of (a prefix covers its submodules)."""

    prefix: str
    spec: str
    why: str
    quiet: bool  # True where a warning already said why (a spec's version gate)


_UNKNOWN: Any = object()

RUNTIME = SITES


class Discovery:
    """The scope of one process, and the verdicts it has seen (thread-safe)."""

    def __init__(self, scope: str, leaves: list[Leave]) -> None:
        self.scope = scope
        self.leaves = sorted(leaves, key=lambda leave: -len(leave.prefix))
        self._lock = _thread.allocate_lock()
        self._indexes: dict[str, _Index] = {}
        # (directory, top-level package) -> its index, or None: out of scope. Dict reads and
        # writes are atomic, and a race only computes the same answer twice.
        self._directories: dict[tuple[str, str], Optional[_Index]] = {}
        self._places: Optional[tuple[tuple[str, ...], tuple[str, ...]]] = None
        self._stdlib_names: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())

    def may_cover(self, fullname: str) -> bool:
        """Cheap, by name only: whether ``fullname`` could be in scope."""
        if self.scope == "specs":
            return False
        top = fullname.partition(".")[0]
        return top not in NEVER and top not in self._stdlib_names

    def decide(self, fullname: str, origin: str) -> Optional[str]:
        """For a module in scope loaded from ``origin`` (a ``.py`` file): the runtime module its
        sites should call, or None to load it as it is.

        Says the one line a left-alone module with sites deserves. Everything but the ``stat``
        is decided once per directory, so a warm process pays about one ``stat`` per module.
        """
        directory = os.path.dirname(origin)
        index = self._directories.get((directory, fullname.partition(".")[0]), _UNKNOWN)
        if index is _UNKNOWN:
            index = self._index_for(fullname, origin, directory)
        if index is None:
            return None
        try:
            status = os.stat(origin)
        except OSError:
            return None
        stamp = (status.st_mtime_ns, status.st_size)
        verdict = index.get(origin, stamp) or self._examine(index, fullname, origin, stamp)
        if not verdict.sites:
            return None
        leave = self._leave(fullname)
        if leave is not None:
            _say_left(fullname, leave)
            return None
        if verdict.kept:
            _keep_as_written(fullname, verdict.kept)
        return RUNTIME

    def take_new(self) -> dict[Optional[str], dict[str, _Entry]]:
        """Every index's verdicts made since they were last written, by index file: a
        ``dmlpatch prepare`` process hands them to the one that writes them."""
        with self._lock:
            indexes = list(self._indexes.values())
        taken: dict[Optional[str], dict[str, _Entry]] = {}
        for index in indexes:
            new = index.take_new()
            if new:
                taken.setdefault(index.path, {}).update(new)
        return taken

    def has_sites(self, fullname: str, origin: str) -> bool:
        """Whether the module would be rewritten by its sites, told without saying anything."""
        directory = os.path.dirname(origin)
        index = self._directories.get((directory, fullname.partition(".")[0]), _UNKNOWN)
        if index is _UNKNOWN:
            index = self._index_for(fullname, origin, directory)
        if index is None or self._leave(fullname) is not None:
            return False
        try:
            status = os.stat(origin)
        except OSError:
            return False
        stamp = (status.st_mtime_ns, status.st_size)
        verdict = index.get(origin, stamp) or self._examine(index, fullname, origin, stamp)
        return bool(verdict.sites)

    def is_program(self, fullname: str, origin: str) -> bool:
        """Whether ``origin`` is the program's own code (outside site-packages and the
        standard library), as the verdict :meth:`decide` gave was made."""
        index = self._directories.get((os.path.dirname(origin), fullname.partition(".")[0]))
        return index is not None and index.program

    def _leave(self, fullname: str) -> Optional[Leave]:
        for leave in self.leaves:
            if fullname == leave.prefix or fullname.startswith(leave.prefix + "."):
                return leave
        return None

    def _index_for(self, fullname: str, origin: str, directory: str) -> Optional[_Index]:
        """The verdict index of the modules of ``fullname``'s top-level package in
        ``directory``; None where scope leaves that directory out."""
        top = fullname.partition(".")[0]
        if self._places is None:
            self._places = _places()
        site, stdlib = self._places
        in_site = origin.startswith(site)
        index: Optional[_Index] = None
        if (in_site or not origin.startswith(stdlib)) and not (self.scope == "project" and in_site):
            key = f"{_root_of(fullname, origin)}\0{top}"
            with self._lock:
                index = self._indexes.get(key)
                if index is None:
                    name = f"{top[:40]}-{file_tag(key)}.idx"
                    cache = cache_subdirectory("discovery", create=False)
                    index = _Index(os.path.join(cache, name) if cache else None, not in_site)
                    self._indexes[key] = index
        self._directories[(directory, top)] = index
        return index

    @staticmethod
    def _examine(index: _Index, fullname: str, origin: str, stamp: tuple[int, int]) -> Verdict:
        started = time.perf_counter()
        source = _source(origin)
        if source is None:
            return Verdict(0, ())
        verdict = _examine(source, origin, index.program)
        index.put(origin, stamp, freshness.source_hash(source), verdict)
        from dmlpatch.rewriting import preparation

        preparation.charge(fullname, time.perf_counter() - started)
        return verdict


def _source(origin: str) -> Optional[bytes]:
    try:
        with open(origin, "rb") as stream:
            return stream.read()
    except OSError:
        return None


#: The last rewrite examined with sites, by origin, with its source: the loader compiles that
#: module next (the finder examines, then the loader runs), and takes the tree instead of
#: rewriting the same source a second time.
_handed: dict[str, tuple[bytes, Any]] = {}


def take_rewrite(origin: str, source: bytes) -> Any:
    """The rewrite examined for ``origin`` if it was of this very source, else None; given
    once."""
    entry = _handed.pop(origin, None)
    return entry[1] if entry is not None and entry[0] == source else None


def _examine(source: bytes, origin: str, program: bool = False) -> Verdict:
    """The verdict for ``source``, parsed only when it may hold sites (``program``: a module
    of the program's own, see ``transform.rewrite``)."""
    if not may_have_sites(source, program):
        return Verdict(0, ())
    from dmlpatch.rewriting.transform import rewrite

    try:
        result = rewrite(source, origin, program=program)
    except (SyntaxError, ValueError):
        return Verdict(0, ())  # the normal loader raises the error the program expects
    except RecursionError:
        return Verdict(0, ())
    if result.sites:
        _handed.clear()  # one at a time: a tree the loader never took is not kept
        _handed[origin] = (source, result)
    return Verdict(len(result.sites), result.unanswered, result.kept)


def is_program_path(path: str) -> bool:
    """Whether ``path`` is the program's own code for the rewriter (``transform.rewrite``'s
    ``program``): outside site-packages and the standard library, as :class:`Discovery` tells
    the program's modules from the libraries'; a module a package wrote at run time is of that
    package's kind (:mod:`dmlpatch.origins`)."""
    from dmlpatch import origins

    path = origins.owner(path) or path
    site, stdlib = _places()
    path = os.path.abspath(path)
    return not path.startswith(site) and not path.startswith(stdlib)


def _root_of(fullname: str, origin: str) -> str:
    """The ``sys.path`` entry a module was found under (its top-level package's parent)."""
    depth = fullname.count(".") + 1
    if os.path.basename(origin).startswith("__init__."):
        depth += 1
    root = origin
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def _places() -> tuple[tuple[str, ...], tuple[str, ...]]:
    import site
    import sysconfig

    sites: set[str] = set()
    for getter in (site.getsitepackages, site.getusersitepackages):
        try:
            found = getter()
        except AttributeError:  # virtualenv's old site.py lacks them
            continue
        sites.update([found] if isinstance(found, str) else found)
    paths = sysconfig.get_paths()
    sites.update(paths[key] for key in ("purelib", "platlib") if key in paths)
    stdlib = {paths[key] for key in ("stdlib", "platstdlib") if key in paths}
    return _prefixes(sites), _prefixes(stdlib)


def _prefixes(directories: set[str]) -> tuple[str, ...]:
    """Each directory with a trailing separator, as given and resolved (symlinked venvs)."""
    found: set[str] = set()
    for directory in directories:
        if directory:
            for form in (os.path.abspath(directory), os.path.realpath(directory)):
                found.add(form.rstrip(os.sep) + os.sep)
    return tuple(sorted(found))


def _say_left(fullname: str, leave: Leave) -> None:
    from dmlpatch import log, record

    record.record_skip(leave.spec, fullname, f"left alone by the spec: {leave.why}")
    if not leave.quiet:
        log.warn_once(
            f"leave:{leave.spec}:{leave.prefix}",
            f"{fullname} left unrewritten: patch spec {leave.spec!r} keeps dmlpatch out of "
            f"{leave.prefix} ({leave.why}); its own device choices stay as under plain python",
        )


def _keep_as_written(fullname: str, kept: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
    from dmlpatch import record
    from dmlpatch.runtime.cuda_only import qualified

    for scope, names in kept:
        where = fullname if scope == "<module>" else f"{fullname}.{scope}"
        record.record_skip(
            DISCOVERED,
            where,
            f"uses {', '.join(qualified(name) for name in names)}, not answered: its sites "
            "keep CUDA's meaning (the rest of the module is rewritten)",
        )


#: One verdict as an index stores it: the source's ``mtime_ns``, size and hash, then the
#: verdict's sites, unanswered names and the functions kept as written.
_Entry = tuple  # (int, int, bytes, int, tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...])


class _Index:
    """Verdicts of one top-level package's sources, by path; read lazily, written at exit.

    ``path`` None: the cache cannot be used, so verdicts live for this process only.
    """

    def __init__(self, path: Optional[str], program: bool = False) -> None:
        self.path = path
        #: Whether these are the program's own modules (outside site-packages).
        self.program = program
        self._entries: Optional[dict[str, _Entry]] = None
        self._new: dict[str, _Entry] = {}
        self._lock = _thread.allocate_lock()

    def get(self, origin: str, stamp: tuple[int, int]) -> Optional[Verdict]:
        with self._lock:
            if self._entries is None:
                self._entries = _read(self.path) if self.path is not None else {}
            entry = self._entries.get(origin)
        if entry is None or (entry[0], entry[1]) != stamp:
            return None
        if freshness.checks_hash(origin):
            source = _source(origin)
            if source is None or freshness.source_hash(source) != entry[2]:
                return None
        return Verdict(entry[3], entry[4], entry[5])

    def put(self, origin: str, stamp: tuple[int, int], digest: bytes, verdict: Verdict) -> None:
        entry = (stamp[0], stamp[1], digest, verdict.sites, verdict.unanswered, verdict.kept)
        with self._lock:
            if self._entries is not None:
                self._entries[origin] = entry
            first = not self._new
            self._new[origin] = entry
        if first and self.path is not None:
            atexit.register(self.flush)

    def flush(self) -> None:
        """Merge the new verdicts into the file, atomically; an unwritable cache is not used."""
        merge(self.path, self.take_new())

    def take_new(self) -> dict[str, _Entry]:
        """The verdicts made since the last flush, which is then left nothing to write."""
        with self._lock:
            new, self._new = self._new, {}
        return new


def merge(path: Optional[str], new: dict[str, _Entry]) -> None:
    """Merge verdicts into the index file at ``path``, atomically (``dmlpatch prepare`` merges
    those its processes made, each package's in one place)."""
    if not new or path is None or cache_subdirectory("discovery") is None:
        return
    merged = _read(path)
    merged.update(new)
    if _write(path, merged):
        _prune(os.path.dirname(path))


def _read(path: str) -> dict[str, _Entry]:
    """The index's well-formed entries; a file that is not this user's, or not an index, is
    empty, and an entry of another shape than :meth:`_Index.put` writes is left out."""
    from dmlpatch import trust

    data = trust.read(path)
    if data is None:
        return {}
    try:
        loaded = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(loaded, tuple) or len(loaded) != 2 or loaded[0] != _FORMAT:
        return {}
    entries = loaded[1]
    if not isinstance(entries, dict):
        return {}
    return {key: entry for key, entry in entries.items() if _well_formed(key, entry)}


def _well_formed(key: object, entry: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(entry, tuple)
        and len(entry) == 6
        and type(entry[0]) is int
        and type(entry[1]) is int
        and isinstance(entry[2], bytes)
        and type(entry[3]) is int
        and _names(entry[4])
        and isinstance(entry[5], tuple)
        and all(
            isinstance(kept, tuple)
            and len(kept) == 2
            and isinstance(kept[0], str)
            and _names(kept[1])
            for kept in entry[5]
        )
    )


def _names(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(name, str) for name in value)


def _write(path: str, entries: dict[str, _Entry]) -> bool:
    from dmlpatch import atomic

    try:
        atomic.write(path, marshal.dumps((_FORMAT, entries)), mode=0o600)
    except (OSError, ValueError):
        return False
    return True


def _prune(directory: str) -> None:
    try:
        names = [name for name in os.listdir(directory) if name.endswith(".idx")]
        if len(names) <= _KEEP:
            return
        paths = sorted((os.path.join(directory, n) for n in names), key=os.path.getmtime)
        for stale in paths[:-_KEEP]:
            os.unlink(stale)
    except OSError:
        return
