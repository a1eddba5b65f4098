"""Why model compute ran on the CPU: the likely cause, with the line that did it.

Read only at exit, and only when a significant share of model compute ran on the CPU, so it
may read source files. In order:

1. **an explicit CPU placement** in the files that ran the CPU compute or in the main script
   (``.to('cpu')``, ``device='cpu'``, ``torch.device('cpu')``): dmlpatch never rewrites those;
2. **a device chosen in a module dmlpatch did not rewrite**: a loaded module with CUDA device
   sites that was outside the scope, kept as written, left alone by a spec, or imported before
   the hook;
3. otherwise, a device the program or a library chose at run time (a ``device=`` argument, a
   library's default).

Where most of the CPU compute ran on device tensors, through DirectML's CPU fallback for an
operator it lacks (or ``DMLPATCH_CPU_OPS``), that operator is the cause (:func:`fallback`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from typing import Optional

from dmlpatch.environment_variables import DMLPATCH_CPU_OPS
from dmlpatch.placement import frames

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple

    from dmlpatch.report_types import LikelyCause
else:
    # Imported at exit: typing's NamedTuple evaluates a string, which in CPython 3.11 makes an
    # interrupted program (Ctrl-C) exit 1 instead of by SIGINT.
    from dmlpatch._tuple import NamedTuple

_EXPLICIT_CPU = re.compile(
    r"""(\.to\(\s*|device\s*=\s*|torch\.device\(\s*|set_default_device\(\s*)(['"])cpu\2"""
)


class Cause(NamedTuple):
    kind: str  # explicit-cpu | not-rewritten | chosen-at-run-time | fallback | cpu-ops
    where: Optional[str]  # file:line
    text: str  # one clause for a person

    def as_dict(self) -> LikelyCause:
        return {"kind": self.kind, "at": self.where, "text": self.text}


def likely(cpu_files: list[str], main_file: Optional[str]) -> Cause:
    """The likely cause for compute that ran from ``cpu_files`` (heaviest first)."""
    candidates = [main_file, *cpu_files] if main_file else list(cpu_files)
    for path in _unique(candidates):
        found = _explicit_cpu(path)
        if found is not None:
            line, text = found
            where = f"{frames.display(path)}:{line}"
            return Cause("explicit-cpu", where, f"an explicit CPU placement at {where}: {text}")
    unrewritten = _unrewritten_site(cpu_files, main_file)
    if unrewritten is not None:
        return unrewritten
    return Cause(
        "chosen-at-run-time",
        None,
        "tensors placed on the CPU where no CUDA site says otherwise (created without "
        "device=, which means the CPU, or given a device the program or a library chose)",
    )


def fallback(operator: str, where: Optional[str]) -> Cause:
    """The cause when CPU fallbacks ran most of the CPU compute: ``operator``, first called at
    ``where``, with its known failure where the catalogue has one."""
    from dmlpatch import opfix
    from dmlpatch.gaps import catalogue

    at = f" (first at {where})" if where else ""
    installed = opfix.installed()
    if installed is not None and operator in installed.cpu_ops:
        return Cause(
            "cpu-ops",
            where,
            f"{DMLPATCH_CPU_OPS} sends {operator} to the CPU{at}; leave it out to run it on the "
            "device",
        )
    known = catalogue.for_gap(operator, "fallback")
    entry = f"; known failure {known[0].key}: {known[0].remedy}" if known else ""
    return Cause(
        "fallback",
        where,
        f"DirectML has no kernel for {operator}, so its CPU fallback ran it{at}{entry}",
    )


def _unique(paths: Iterable[Optional[str]]) -> list[str]:
    seen: list[str] = []
    for path in paths:
        if path and path not in seen and os.path.isfile(path):
            seen.append(path)
    return seen


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().splitlines()
    except OSError:
        return []


def _explicit_cpu(path: str) -> Optional[tuple[int, str]]:
    for number, line in enumerate(_lines(path), 1):
        code = line.split("#", 1)[0]
        if "cuda" not in code and _EXPLICIT_CPU.search(code):
            return number, line.strip()
    return None


def _unrewritten_site(cpu_files: list[str], main: Optional[str]) -> Optional[Cause]:
    """A loaded module with a CUDA device site that was not rewritten, preferring the files
    that ran the compute, then the program's own files (beside the main script)."""
    from dmlpatch import record
    from dmlpatch.rewriting import transform as rewrite

    rewritten, skipped = record.module_fates()
    home = os.path.dirname(os.path.abspath(main)) + os.sep if main else None
    modules = _loaded_sources()
    by_path = {path: name for name, path in modules.items()}
    # The packages that ran the compute, and the program's own files: a device chosen
    # anywhere else (torch's siblings, an unrelated library) did not place this model.
    packages = {by_path[f].partition(".")[0] for f in cpu_files if f in by_path}
    candidates = [
        name
        for name, path in modules.items()
        if name.partition(".")[0] in packages or (home is not None and path.startswith(home))
    ]
    order = sorted(candidates, key=lambda name: (modules[name] not in cpu_files, name))
    for name in order:
        path = modules[name]
        # The main script runs as __main__ (and is known as __mp_main__ to spawned workers).
        if name in rewritten or name == "__main__" or path == main:
            continue
        try:
            with open(path, "rb") as handle:
                source = handle.read()
        except OSError:
            continue
        if b"cuda" not in source:
            continue
        try:
            sites = rewrite.find_sites(source, path)
        except Exception:  # a source this Python cannot parse (or too deep) is no answer
            continue
        # Only a choice that falls back without CUDA places a model on the CPU; a plain
        # "cuda:0" would have failed instead.
        choices = [s for s in sites if s.kind == "is_available"]
        if not choices:
            continue
        site = choices[0]
        where = f"{frames.display(path)}:{site.line}"
        lines = source.decode("utf-8", "replace").splitlines()
        text = lines[site.line - 1].strip() if site.line <= len(lines) else site.text
        why = skipped.get(name) or _out_of_scope_reason()
        return Cause(
            "not-rewritten",
            where,
            f"the device is chosen at {where} ({text}) in module {name}, which dmlpatch "
            f"did not rewrite: {why}",
        )
    return None


def _out_of_scope_reason() -> str:
    from dmlpatch.rewriting import scope as scopes

    scope = scopes.configured_scope()
    if scope == "specs":
        return "outside scope 'specs' (only libraries with a patch spec are rewritten)"
    if scope == "project":
        return "outside scope 'project' (only the program's own files are rewritten)"
    return "it was imported before dmlpatch's import hook"


def _loaded_sources() -> dict[str, str]:
    """Loaded modules with a ``.py`` source outside torch, dmlpatch and the standard library."""
    import sysconfig

    stdlib = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            continue
        path = os.path.abspath(path)
        if frames.internal(path):
            continue
        if path.startswith(stdlib) and "site-packages" not in path:
            continue
        found[name] = path
    return found
