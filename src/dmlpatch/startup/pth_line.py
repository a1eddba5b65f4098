"""The start-up lines dmlpatch writes into ``.pth`` files, and finding them again.

``site.py`` executes each ``import`` line of the ``.pth`` files in site-packages when any Python
process of the environment starts, and prints a seven-line "Error processing line" for one that
raises. dmlpatch's lines (``dmlpatch activate``, ``dmlpatch pin``) must cost almost nothing and
say nothing where there is nothing to do, dmlpatch gone included:

- a ``stat`` of a file of dmlpatch's own (the *guard*) first: after a regular ``pip uninstall``
  it is gone, and the line imports nothing;
- after an editable install is uninstalled the sources stay, so the guard does too: the import
  then fails with ``No module named 'dmlpatch'``, and the line says nothing (any other error
  still shows, as a bug should);
- the argument (the device, the constraints file) is a string literal in a dictionary at the end
  of the line, read back with ``ast.literal_eval`` and never executed by dmlpatch itself.

A ``.pth`` file may hold other lines (a user's, another tool's): dmlpatch finds its own line by
what it imports and leaves the others as they are (:func:`split`).
"""

from __future__ import annotations

import ast
import re

from dmlpatch.environment_variables import DMLPATCH_DISABLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

_LINE = (
    "import os; os.environ.get({disable!r}) != '1' and os.path.exists({guard!r}) and "
    "exec({code!r}, {{'argument': {argument!r}}})\n"
)
_PIP_LINE = (
    "import os, sys; ('pip' in getattr(sys, 'orig_argv', sys.argv)[1:3] or "
    "os.path.basename(sys.argv[0] if sys.argv else '').startswith('pip')) and "
    "os.path.exists({guard!r}) and exec({code!r}, {{'argument': {argument!r}}})\n"
)
_CODE = (
    "try:\n"
    " from {package} import {module}\n"
    "except ModuleNotFoundError as missing:\n"
    " if missing.name != 'dmlpatch':\n"
    "  raise\n"
    "else:\n"
    " {module}.{function}(argument)\n"
)
_ARGUMENT = re.compile(r"\{'argument': (?P<literal>'[^\n]*'|\"[^\n]*\")\}\)\s*$")
_GUARD = re.compile(r"os\.path\.exists\((?P<literal>'[^']*'|\"[^\"]*\")\)")


def line(guard: str, target: str, argument: str, only_pip: bool = False) -> str:
    """The line that calls ``target`` (``"package.module:function"``) with ``argument`` when the
    file ``guard`` exists and dmlpatch imports; ``only_pip``: in pip's processes only."""
    where, function = target.split(":")
    package, module = where.rsplit(".", 1)
    code = _CODE.format(package=package, module=module, function=function)
    template = _PIP_LINE if only_pip else _LINE
    return template.format(guard=guard, code=code, argument=argument, disable=DMLPATCH_DISABLE)


def is_ours(text: str, target: str) -> bool:
    """Whether ``text`` is a line of dmlpatch's calling ``target``'s function: of this form, or
    of the earlier ``__import__('dmlpatch....')`` one (any module layout)."""
    function = target.split(":")[1]
    return (
        text.startswith("import ")
        and ("from dmlpatch." in text or "__import__('dmlpatch." in text)
        and function in text
    )


def argument(text: str) -> Optional[str]:
    """The argument literal of one of dmlpatch's lines, or None."""
    match = _ARGUMENT.search(text) or _OLD_ARGUMENT.search(text)
    return _string(match.group("literal")) if match is not None else None


def guard(text: str) -> Optional[str]:
    """The guard file a line names, or None."""
    match = _GUARD.search(text)
    return _string(match.group("literal")) if match is not None else None


def _string(literal: str) -> Optional[str]:
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


#: The earlier form ended with ``__import__('package.module')....function('argument')``.
_OLD_ARGUMENT = re.compile(r"\.(?:startup|watch)\((?P<literal>'[^\n]*'|\"[^\n]*\")\)\s*$")


def split(content: str, target: str) -> tuple[Optional[str], list[str]]:
    """dmlpatch's line for ``target`` in a ``.pth`` file's ``content`` (the first, which is the
    one in force: start-up happens once), and the file's other lines, with their endings."""
    ours: Optional[str] = None
    others: list[str] = []
    for text in content.splitlines(keepends=True):
        if is_ours(text, target):
            ours = text if ours is None else ours
        else:
            others.append(text)
    return ours, others
