"""Patch specs: one declarative TOML file per target library.

A spec says which distribution and versions it is for, which modules get their CUDA device
sites rewritten (``[[rewrite]]``), which functions get a fix wrapped around them
(``[[wrap]]``), which missing modules are provided by their successors (``[[alias]]``) and
which modules discovery must leave alone (``[[leave]]``), each with the ``why`` a reader needs
to audit it. Specs come from the package
(``dmlpatch/patches``), from the ``dmlpatch.patches`` entry-point group (patch packs) and from
``$DMLPATCH_PATCHES`` (directories separated by ``os.pathsep``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, TypeVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from dmlpatch.environment_variables import DMLPATCH_DISABLE_PATCHES, DMLPATCH_PATCHES
from dmlpatch.errors import SpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the standard library gained tomllib in 3.11
    import tomli as tomllib

ENTRY_POINT_GROUP = "dmlpatch.patches"
FOLDER_SPEC = "spec.toml"  # a library's folder holds its spec and its fixes
_R = TypeVar("_R")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class RewriteRule:
    modules: tuple[str, ...]
    expect_sites: int
    versions: SpecifierSet
    why: str


@dataclass(frozen=True)
class WrapRule:
    target: str  # "package.module:Qualified.name"
    fix: str  # "package.module:function", a wrapper fix(wrapped, instance, args, kwargs)
    versions: SpecifierSet
    why: str

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


@dataclass(frozen=True)
class AliasRule:
    module: str  # the name a library imports, e.g. "torchvision.transforms.functional_tensor"
    target: str  # the module that now provides it
    versions: SpecifierSet
    why: str


@dataclass(frozen=True)
class LeaveRule:
    modules: tuple[str, ...]  # each covers its submodules
    versions: SpecifierSet
    why: str


@dataclass(frozen=True)
class PatchSpec:
    name: str
    origin: str  # file path, for messages
    distribution: str
    versions: SpecifierSet
    why: str
    rewrites: tuple[RewriteRule, ...]
    wraps: tuple[WrapRule, ...]
    fingerprint: str
    aliases: tuple[AliasRule, ...] = ()
    pack: Optional[str] = None  # the entry-point name of the patch pack that shipped it
    leaves: tuple[LeaveRule, ...] = ()

    def modules(self) -> list[str]:
        return [module for rule in self.rewrites for module in rule.modules]

    def packages(self) -> list[str]:
        """The top-level packages this spec's rules are about (for its version gate)."""
        names = [*self.modules(), *(w.module for w in self.wraps)]
        names += [module for rule in self.leaves for module in rule.modules]
        return sorted({name.partition(".")[0] for name in names})


def load_file(path: Path) -> PatchSpec:
    """Parse and validate one spec; :class:`SpecError` names the file and the field."""
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as error:
        raise SpecError(f"patch spec {path}: cannot read it ({error.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise SpecError(f"patch spec {path}: not valid TOML ({error})") from None
    reader = _Reader(str(path), data)
    package = reader.table("package")
    distribution = reader.string(package, "package.name")
    versions = reader.versions(package, "package.versions")
    why = reader.string(package, "package.why", required=False) or ""
    reader.no_extra(package, "package", {"name", "versions", "why"})
    rewrites: list[RewriteRule] = _entries(
        reader, "rewrite", (("modules", _dotted_names), ("expect_sites", _site_count)), RewriteRule
    )
    wraps: list[WrapRule] = _entries(
        reader, "wrap", (("target", _qualified_name), ("fix", _qualified_name)), WrapRule
    )
    aliases: list[AliasRule] = _entries(
        reader, "alias", (("module", _dotted_name), ("target", _dotted_name)), AliasRule
    )
    leaves: list[LeaveRule] = _entries(reader, "leave", (("modules", _dotted_names),), LeaveRule)
    reader.no_extra(data, "the top level", {"package", "rewrite", "wrap", "alias", "leave"})
    if not rewrites and not wraps and not aliases and not leaves:
        reader.fail(
            "rewrite",
            "a spec needs at least one [[rewrite]], [[wrap]], [[alias]] or [[leave]] entry",
        )
    return PatchSpec(
        name=spec_name(path),
        origin=str(path),
        distribution=distribution,
        versions=versions,
        why=why,
        rewrites=tuple(rewrites),
        wraps=tuple(wraps),
        fingerprint=hashlib.sha256(raw).hexdigest()[:16],
        aliases=tuple(aliases),
        leaves=tuple(leaves),
    )


#: Reads one field of an entry: (reader, entry, "table[i].field") -> its checked value.
_Field = Callable[["_Reader", dict[str, Any], str], Any]


def _entries(
    reader: _Reader, table: str, fields: tuple[tuple[str, _Field], ...], rule: Callable[..., _R]
) -> list[_R]:
    """Each ``[[table]]`` entry as ``rule(*fields, versions, why)``: its own fields in order,
    then the ``versions`` and ``why`` every entry has, and no other key."""
    rules = []
    for index, entry in enumerate(reader.array(table)):
        where = f"{table}[{index}]"
        values = [read(reader, entry, f"{where}.{name}") for name, read in fields]
        versions = reader.versions(entry, f"{where}.versions")
        rules.append(rule(*values, versions, reader.string(entry, f"{where}.why")))
        reader.no_extra(entry, where, {*(name for name, _ in fields), "versions", "why"})
    return rules


def _dotted_names(reader: _Reader, entry: dict[str, Any], field_name: str) -> tuple[str, ...]:
    modules = reader.strings(entry, field_name)
    for module in modules:
        if not _DOTTED.match(module):
            reader.fail(field_name, f"{module!r} is not a dotted module name")
    return tuple(modules)


def _dotted_name(reader: _Reader, entry: dict[str, Any], field_name: str) -> str:
    value = reader.string(entry, field_name)
    if not _DOTTED.match(value):
        reader.fail(field_name, f"{value!r} is not a dotted module name")
    return value


def _qualified_name(reader: _Reader, entry: dict[str, Any], field_name: str) -> str:
    value = reader.string(entry, field_name)
    if not _TARGET.match(value):
        reader.fail(field_name, f"{value!r} is not 'module:qualified.name'")
    return value


def _site_count(reader: _Reader, entry: dict[str, Any], field_name: str) -> int:
    expect = entry.get(field_name.rpartition(".")[2], 1)
    if not isinstance(expect, int) or isinstance(expect, bool) or expect < 0:
        reader.fail(field_name, "must be a whole number >= 0")
    return expect


class _Reader:
    """Typed access to a parsed TOML document that reports the file and field on error."""

    def __init__(self, origin: str, data: dict[str, Any]) -> None:
        self.origin = origin
        self.data = data

    def fail(self, field_name: str, problem: str) -> NoReturn:
        raise SpecError(f"patch spec {self.origin}: field {field_name!r} {problem}")

    def table(self, key: str) -> dict[str, Any]:
        value = self.data.get(key)
        if not isinstance(value, dict):
            self.fail(key, "is missing or is not a table ([" + key + "])")
        return value

    def array(self, key: str) -> list[dict[str, Any]]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.fail(key, f"must be an array of tables ([[{key}]])")
        return value

    def string(self, table: dict[str, Any], field_name: str, required: bool = True) -> str:
        value = table.get(field_name.rsplit(".", 1)[-1])
        if value is None and not required:
            return ""
        if not isinstance(value, str) or not value.strip():
            self.fail(field_name, "is missing or is not a non-empty string")
        return value

    def strings(self, table: dict[str, Any], field_name: str) -> list[str]:
        value = table.get(field_name.rsplit(".", 1)[-1])
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            self.fail(field_name, "is missing or is not a non-empty list of strings")
        return [str(v) for v in value]

    def versions(self, table: dict[str, Any], field_name: str) -> SpecifierSet:
        value = table.get(field_name.rsplit(".", 1)[-1], "")
        if not isinstance(value, str):
            self.fail(field_name, "must be a version specifier string such as '>=0.2.5,<0.4'")
        try:
            return SpecifierSet(value)
        except InvalidSpecifier:
            self.fail(field_name, f"{value!r} is not a valid version specifier")

    def no_extra(self, table: dict[str, Any], where: str, allowed: set[str]) -> None:
        extra = sorted(set(table) - allowed)
        if extra:
            self.fail(
                f"{where}",
                f"has unknown key(s) {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})",
            )


def builtin_directory() -> Optional[Path]:
    """``dmlpatch/patches``: one folder per library, holding its ``spec.toml`` and its fixes."""
    directory = Path(__file__).resolve().parent.parent / "patches"
    return directory if directory.is_dir() else None


def spec_files() -> list[Path]:
    """Every spec file, built-ins first, then patch packs, then ``$DMLPATCH_PATCHES``."""
    return [path for _, directory in _sources() for path in specs_in(directory)]


def specs_in(directory: Path) -> list[Path]:
    """The specs of one directory: ``NAME.toml`` files and ``NAME/spec.toml`` folders."""
    return sorted([*directory.glob("*.toml"), *directory.glob(f"*/{FOLDER_SPEC}")])


def spec_name(path: Path) -> str:
    """``ultralytics`` for ``ultralytics.toml`` and for ``ultralytics/spec.toml``."""
    return path.parent.name if path.name == FOLDER_SPEC else path.stem


def spec_directories() -> list[Path]:
    return [directory for _, directory in _sources()]


def _sources() -> list[tuple[Optional[str], Path]]:
    """(pack name or None, directory) for every place specs come from, in load order."""
    sources: list[tuple[Optional[str], Path]] = []
    builtin = builtin_directory()
    if builtin is not None:
        sources.append((None, builtin))
    sources.extend(_pack_directories())
    sources.extend((None, directory) for directory in _environment_directories())
    return sources


def _environment_directories() -> list[Path]:
    directories = []
    for part in os.environ.get(DMLPATCH_PATCHES, "").split(os.pathsep):
        if part:
            directory = Path(part)
            if not directory.is_dir():
                raise SpecError(f"{DMLPATCH_PATCHES} names {part!r}, which is not a directory")
            directories.append(directory)
    return directories


def _pack_directories() -> list[tuple[Optional[str], Path]]:
    from dmlpatch._metadata import entry_points

    directories: list[tuple[Optional[str], Path]] = []
    for entry_point in entry_points(ENTRY_POINT_GROUP):
        if entry_point.name in _disabled():
            continue
        try:
            target = entry_point.load()
        except Exception as error:  # a broken pack must not stop the program
            _skip_pack(entry_point.name, f"it failed to load ({entry_point.value}: {error})")
            continue
        location = getattr(target, "__file__", None) or str(target)
        path = Path(location)
        directories.append((entry_point.name, path.parent if path.is_file() else path))
    return directories


def _skip_pack(name: str, reason: str) -> None:
    from dmlpatch import log

    message = f"patch pack {name!r} skipped: {reason}"
    _skipped_packs.append((name, message, reason))
    log.warn_once(f"pack:{name}", message)


#: (pack, message, reason) for each pack skipped while loading: the plan keeps them, so a
#: process that reads the cached plan still says why a pack is not active.
_skipped_packs: list[tuple[str, str, str]] = []


def skipped_packs() -> list[tuple[str, str, str]]:
    """The packs skipped so far in this process, and why."""
    return list(_skipped_packs)


def _disabled() -> set[str]:
    names = os.environ.get(DMLPATCH_DISABLE_PATCHES, "")
    return {n.strip() for n in names.split(",") if n.strip()}


def unmatched_disabled() -> list[str]:
    """Names in ``$DMLPATCH_DISABLE_PATCHES`` that no spec file or patch pack has (a typo
    would otherwise leave the spec active without a word)."""
    disabled = _disabled()
    if not disabled:
        return []
    from dmlpatch._metadata import entry_points

    known = {spec_name(path) for path in spec_files()}
    known.update(entry_point.name for entry_point in entry_points(ENTRY_POINT_GROUP))
    return sorted(disabled - known)


def load_all() -> list[PatchSpec]:
    """All specs, minus the specs and packs named in ``$DMLPATCH_DISABLE_PATCHES``.

    A malformed built-in or local spec is an error (:class:`SpecError`); a patch pack with a
    malformed spec, or whose fixes cannot be found, is skipped whole with one warning: a
    third-party pack must not stop the program. A spec in a ``$DMLPATCH_PATCHES`` directory
    replaces a built-in or pack spec of the same name (a user's local fix for a stale spec);
    any other clash of names is an error.
    """
    disabled = _disabled()
    local = {str(d) for d in _environment_directories()}
    loaded: dict[str, PatchSpec] = {}
    overridden: set[str] = set()
    _replaced.clear()
    for pack, directory in _sources():
        specs = _load_directory(pack, directory)
        for spec in specs:
            if spec.name in disabled:
                continue
            if spec.name in loaded:
                if str(directory) in local and spec.name not in overridden:
                    overridden.add(spec.name)
                    _replaced[spec.name] = loaded[spec.name].origin
                    loaded[spec.name] = spec
                    continue
                raise SpecError(
                    f"two patch specs are named {spec.name!r}: {loaded[spec.name].origin} and "
                    f"{spec.origin}"
                )
            loaded[spec.name] = spec
    return list(loaded.values())


#: Spec name -> the origin of the built-in or pack spec a DMLPATCH_PATCHES one replaced, as
#: :func:`load_all` last found them.
_replaced: dict[str, str] = {}


def replaced() -> dict[str, str]:
    """The specs a ``$DMLPATCH_PATCHES`` spec replaced in the last :func:`load_all`: name ->
    origin of the one replaced."""
    return dict(_replaced)


def local_specs() -> list[tuple[PatchSpec, Optional[str]]]:
    """The ``$DMLPATCH_PATCHES`` specs in force, each with the origin of the spec it replaces
    (None: a name of its own), for ``status`` and ``doctor`` (raises :class:`SpecError`)."""
    local = {str(d) for d in _environment_directories()}
    if not local:
        return []
    specs = load_all()
    found = [s for s in specs if any(s.origin.startswith(d + os.sep) for d in local)]
    return [(spec, _replaced.get(spec.name)) for spec in found]


def describe_local(spec: PatchSpec, replacing: Optional[str]) -> str:
    """One line: where a local spec comes from, what it replaces, and what it wraps, which may
    be any function of any module: its fixes run as dmlpatch's own."""
    what = f"replaces dmlpatch's own ({replacing})" if replacing else "a spec of its own"
    wraps = ", ".join(f"{w.target} with {w.fix}" for w in spec.wraps) or "nothing"
    return (
        f"patch spec {spec.name!r} from {DMLPATCH_PATCHES} ({spec.origin}), {what}: it wraps "
        f"{wraps} and rewrites {len(spec.modules())} module(s)"
    )


def _load_directory(pack: Optional[str], directory: Path) -> list[PatchSpec]:
    specs = []
    for path in specs_in(directory):
        try:
            spec = load_file(path)
        except SpecError as error:
            if pack is None:
                raise
            _skip_pack(pack, str(error))
            return []
        specs.append(dataclasses.replace(spec, pack=pack) if pack else spec)
    if pack is not None:
        missing = [w.fix for spec in specs for w in spec.wraps if not _findable(w.fix)]
        if missing:
            _skip_pack(pack, f"its fix {missing[0]} cannot be imported (module not found)")
            return []
    return specs


def _findable(reference: str) -> bool:
    """Whether the fix's module exists, without executing it (fixes import torch)."""
    import importlib.util

    module = reference.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
