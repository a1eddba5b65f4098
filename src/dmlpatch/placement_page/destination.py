"""Where a placement page goes: ``check --html DIR`` (``DIR/index.html``) or a report path that
ends in ``.html``; checked before the program runs, written after it."""

from __future__ import annotations

import os

from dmlpatch.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from dmlpatch.placement_page.page import Report

INDEX = "index.html"


def is_page(path: str) -> bool:
    """Whether a report path asks for the page rather than JSON."""
    return path.lower().endswith((".html", ".htm"))


def check_directory(directory: str) -> None:
    """A one-line error now for a directory the page could not be written in at the end.

    Creates nothing: the directory is made with the page.
    """
    path = os.path.abspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"cannot write the page in {path!r}: it is a file, not a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"cannot write the page in {path!r}: {existing!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write the page in {path!r}: permission denied")


def write_directory(directory: str, report: Report) -> str:
    """Write ``DIR/index.html`` (the directory made if missing); returns its path."""
    from dmlpatch.placement_page import page

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, INDEX)
    page.write(path, report)
    return path
