"""The source lines a placement page shows: the program's own files whole, a library's file as
the lines that computed with a little context around each.

A program's file is one outside every installed-package directory (``site-packages``, the
standard library); a library's is inside one. Library files run to thousands of lines
(transformers' modelling files), of which a handful did model work.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tokenize
from typing import NamedTuple, Optional

from dmlpatch import origins

#: Lines shown above and below each computing line of a library's file.
CONTEXT = 3
#: A program's file longer than this is shown as a library's is.
WHOLE_FILE_LIMIT = 5000


class Shown(NamedTuple):
    """One file as the page shows it."""

    path: str
    display: str
    #: ``program`` or ``library``.
    kind: str
    #: (line number, text) in order; None between two numbers marks lines left out.
    lines: list[Optional[tuple[int, str]]]
    #: Why the source is missing (a file since deleted, a compiled module), else "".
    missing: str = ""


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path) + os.sep)
    for path in sys.path:
        if path.endswith(("site-packages", "dist-packages")):
            roots.add(os.path.realpath(path) + os.sep)
    return tuple(sorted(roots))


def kind_of(path: str, roots: Optional[tuple[str, ...]] = None) -> str:
    """``library`` for a file inside an installed-package directory, else ``program``; a module
    a package wrote at run time is of that package's kind (:mod:`dmlpatch.origins`)."""
    generator = origins.owner(path)
    if generator is not None:
        path = generator
    real = os.path.realpath(path)
    inside = roots if roots is not None else _library_roots()
    if real.startswith(inside) or f"{os.sep}site-packages{os.sep}" in real:
        return "library"
    return "program"


def display(path: str, kind: str = "program") -> str:
    """A library's file from its package on; else relative to the working directory when
    under it."""
    marker = f"{os.sep}site-packages{os.sep}"
    if kind == "library" and marker in path:
        return path.rsplit(marker, 1)[1]
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return path if relative.startswith("..") else relative


def read(path: str) -> tuple[list[str], str]:
    """The file's lines, or an empty list and why."""
    try:
        with tokenize.open(path) as handle:  # the encoding the file declares, as python reads it
            return handle.read().splitlines(), ""
    except (OSError, SyntaxError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        return [], f"source not readable: {reason}"


def shown(path: str, marked: set[int], roots: Optional[tuple[str, ...]] = None) -> Shown:
    """What the page shows of ``path``, whose ``marked`` lines computed."""
    kind = kind_of(path, roots)
    text, missing = read(path)
    if missing:
        return Shown(path, display(path, kind), kind, [], missing)
    if kind == "program" and len(text) <= WHOLE_FILE_LIMIT:
        return Shown(path, display(path, kind), kind, list(enumerate(text, start=1)))
    wanted: set[int] = set()
    for number in marked:
        wanted.update(range(max(1, number - CONTEXT), min(len(text), number + CONTEXT) + 1))
    lines: list[Optional[tuple[int, str]]] = []
    previous = 0
    for number in sorted(wanted):
        if lines and number != previous + 1:
            lines.append(None)
        lines.append((number, text[number - 1]))
        previous = number
    return Shown(path, display(path, kind), kind, lines)
