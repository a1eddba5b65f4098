"""pip's configuration files, read the way pip reads them, and edited without rewriting them.

pip reads its files in order — global ones (``/etc/xdg/pip/pip.conf``,
``C:\\ProgramData\\pip\\pip.ini``, ...), then the user's, then the environment's own *site* file,
``sys.prefix/pip.conf`` (``pip.ini`` on Windows) — into one table of ``section.key`` values in
which a later file replaces an earlier file's value. ``pip install`` then takes a key from
``[install]`` before ``[global]``, and ``$PIP_CONSTRAINT`` before both. A ``constraint`` value is
a list split on whitespace (so a path with a space must be written as a ``file:`` URL).
``PIP_CONFIG_FILE=os.devnull`` makes pip read no file at all.

dmlpatch writes only the site file. Its edits are textual, so the user's lines, comments and
line endings stay as they were, and each edited text is parsed with the parser pip uses
(``configparser.RawConfigParser``, strict) and compared with what it must now say before it is
handed back: an edit pip would read differently is never written.
"""

from __future__ import annotations

import configparser
import locale
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from dmlpatch.errors import DmlpatchError


def site_file_name(platform: str = sys.platform) -> str:
    """pip's name for a configuration file on ``platform``."""
    return "pip.ini" if platform.startswith("win") else "pip.conf"


SITE_FILE_NAME = site_file_name()
KEY = "constraint"
NOTE = (
    "# added by dmlpatch pin; dmlpatch unpin takes it out (without dmlpatch: delete this line "
    "and the constraint below)"
)
#: What earlier releases wrote above the constraint: still recognised, to be taken out.
_NOTES = (NOTE, "# added by dmlpatch pin; dmlpatch unpin takes it out")

_SECTION = re.compile(r"\[(?P<header>.+)\]")  # configparser's SECTCRE, matched on a stripped line
_OPTION = re.compile(r"(?P<option>.*?)\s*[=:]\s*(?P<value>.*)$")


def site_file() -> Path:
    """The pip configuration file of this environment, as pip names it (it may not exist)."""
    return Path(sys.prefix) / SITE_FILE_NAME


def parse(content: bytes, name: str) -> configparser.RawConfigParser:
    """Parse as pip does (its locale's encoding, a strict RawConfigParser), or say why not."""
    parser = configparser.RawConfigParser()
    try:
        parser.read_string(content.decode(locale.getpreferredencoding(False)), name)
    except (configparser.Error, UnicodeDecodeError) as error:
        reason = " ".join(str(error).split())
        raise DmlpatchError(
            f"{name} is not a valid pip configuration file ({reason}); pip cannot read it "
            "either: fix it, then run the command again"
        ) from None
    return parser


def constraints(parser: configparser.RawConfigParser, section: str) -> Optional[list[str]]:
    """The constraint list ``section`` gives, None when it gives none.

    ``[DEFAULT]`` counts only inside a section the file has: pip reads ``parser.items(s)`` for
    each of ``parser.sections()``.
    """
    value = parser.get(section, KEY, fallback=None) if parser.has_section(section) else None
    return value.split() if value else None


#: Asked of the environment's pip in a process of its own: importing pip's internals here
#: would import the standard library's distutils (older pips, Python < 3.12), after which
#: setuptools (torch.utils.cpp_extension, the simulator's build) fails its own assertion.
_ASK_PIP = (
    "import json\n"
    "from pip._internal.configuration import get_configuration_files\n"
    "names = get_configuration_files()\n"
    "print(json.dumps([n for kind in ('global', 'user') for n in names.get(kind, [])]))\n"
)


def outer_files() -> Optional[list[tuple[str, bytes]]]:
    """pip's global then user configuration files that exist (read before the site file).

    Their names are asked of the environment's own pip, which knows where its platform keeps
    them; None when it cannot say (no pip, or a pip whose internals moved).
    """
    import json
    import subprocess

    try:
        asked = subprocess.run(
            [sys.executable, "-I", "-c", _ASK_PIP],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        listed = json.loads(asked.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None  # pip's failure only means "unknown"
    if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
        return None
    found = []
    for name in listed:
        try:
            found.append((name, Path(name).read_bytes()))
        except OSError:
            continue
    return found


def install_constraints(files: list[tuple[str, bytes]]) -> Optional[list[str]]:
    """What ``pip install`` takes as its constraint list from these files, read in this order."""
    found: dict[str, list[str]] = {}
    for name, content in files:
        try:
            parser = parse(content, name)
        except DmlpatchError:
            continue  # pip stops at such a file itself; it contributes nothing here
        for section in ("global", "install"):
            value = constraints(parser, section)
            if value is not None:
                found[section] = value
    return found.get("install", found.get("global"))


def with_constraint(
    content: Optional[bytes], name: str, added: list[str], inherited: Optional[list[str]]
) -> tuple[bytes, list[str]]:
    """``content`` (None: no file) whose ``[install]`` constraint list also holds ``added``.

    Where ``[install]`` already names a constraint, ``added`` is appended to it. Otherwise a
    ``constraint`` key is written there holding ``added`` and ``inherited`` — the list pip took
    before from another file or from ``[global]``, which the new key would otherwise hide.
    Returns the new content and every entry written into it.
    """
    text = (content or b"").decode("latin-1")  # byte for byte: only ASCII is inserted
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = _split(text)
    own = constraints(parse(content or b"", name), "install")
    found = _find(lines)
    if found.key is not None:
        written = [*added, *([] if own else (inherited or []))]  # an empty key hid nothing
        expected = [*(own or []), *written]
        indent = _indent(lines[found.key]) + "    "
        lines[found.end : found.end] = [f"{indent}{token}{newline}" for token in written]
    else:
        written = expected = [*added, *(inherited or [])]
        block = [f"{KEY} = {expected[0]}{newline}"]
        block += [f"    {token}{newline}" for token in expected[1:]]
        if found.section is not None:
            lines[found.section + 1 : found.section + 1] = [f"{NOTE}{newline}", *block]
        else:
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += newline
            lines += [f"{NOTE}{newline}", f"[install]{newline}", *block]
    result = "".join(lines).encode("latin-1")
    if constraints(parse(result, name), "install") != expected:
        raise DmlpatchError(
            f"cannot add {added[0]} to {name}: pip would read the edited file differently; "
            "add it to the constraint key of its [install] section by hand"
        )
    return result, written


def without_tokens(
    content: bytes, name: str, removed: list[str], created_key: bool, created_section: bool
) -> bytes:
    """``content`` with each of ``removed`` taken out of the ``[install]`` constraint list once.

    For a site file that changed after dmlpatch edited it. The key goes when dmlpatch wrote it
    and nothing is left in it, and so does the ``[install]`` header when dmlpatch wrote that and
    nothing is left under it. Every other key keeps its value (checked).
    """
    lines = _split(content.decode("latin-1"))
    found = _find(lines)
    if found.key is None:
        return content
    expected = _layout(content, name)
    remaining = list(removed)
    kept: list[str] = []
    for index in range(found.key, found.end):
        line = lines[index]
        if not _meaningful(line):
            continue  # a blank or comment line inside the value
        cut = _value_start(line) if index == found.key else len(_indent(line))
        tokens = line[cut:].split()
        survivors = []
        for token in tokens:
            if token in remaining:
                remaining.remove(token)
            else:
                survivors.append(token)
        kept += survivors
        if survivors != tokens:
            ending = line[len(line.rstrip("\r\n")) :]
            if index == found.key:
                lines[index] = " ".join([line[:cut].rstrip(), *survivors]) + ending
            else:
                lines[index] = f"{_indent(line)}{' '.join(survivors)}{ending}" if survivors else ""
    expected[("install", KEY)] = kept
    if not kept and created_key:
        del expected[("install", KEY)]
        del lines[found.key : found.end]
        if _is_note(lines, found.key - 1):
            del lines[found.key - 1]
    if created_section and found.section is not None:
        end = found.section + 1
        while end < len(lines) and not _SECTION.match(lines[end].strip()):
            end += 1
        if not any(_meaningful(line) for line in lines[found.section + 1 : end]):
            start = found.section - _is_note(lines, found.section - 1)
            del lines[start:end]
    result = "".join(lines).encode("latin-1")
    if _layout(result, name) != expected:
        raise DmlpatchError(
            f"cannot take {removed[0]} out of {name} by itself: remove it from the constraint "
            "key of its [install] section by hand, then run the command again"
        )
    return result


def _layout(content: bytes, name: str) -> dict[tuple[str, str], list[str]]:
    """Every key of every section as written (``[DEFAULT]`` read as a section of its own)."""
    parse(content, name)  # pip's reading first, for its message
    parser = configparser.RawConfigParser(default_section="\0")
    parser.read_string(content.decode(locale.getpreferredencoding(False)), name)
    return {
        (section, key): (value or "").split()
        for section in parser.sections()
        for key, value in parser.items(section)
    }


def has_install_section(content: Optional[bytes]) -> bool:
    return _find(_split((content or b"").decode("latin-1"))).section is not None


def has_install_key(content: Optional[bytes]) -> bool:
    """Whether ``[install]`` itself has a constraint key (an empty one included)."""
    return _find(_split((content or b"").decode("latin-1"))).key is not None


class _Found(NamedTuple):
    section: Optional[int]  # the [install] header's line
    key: Optional[int]  # the line of its constraint key
    end: int  # the line after that key's last value line


def _find(lines: list[str]) -> _Found:
    """Where ``[install]`` and its constraint key are, walking the lines as configparser does.

    A value goes on over lines indented deeper than its key's line; blank and comment lines in
    between neither end it nor belong to it.
    """
    section_name = None
    section = key = None
    end = 0
    indent_level = 0
    in_ours = in_option = False
    for index, line in enumerate(lines):
        if not _meaningful(line):
            continue
        indent = len(_indent(line))
        if in_option and indent > indent_level:
            if in_ours:
                end = index + 1
            continue
        indent_level = indent
        stripped = line.strip()
        header = _SECTION.match(stripped)
        if header:
            section_name = header.group("header")
            section = index if section_name == "install" else section
            in_option = in_ours = False
            continue
        option = _OPTION.match(stripped)
        in_option = option is not None
        in_ours = (
            option is not None
            and section_name == "install"
            and option.group("option").lower() == KEY
        )
        if in_ours:
            key, end = index, index + 1
    return _Found(section, key, end)


def _is_note(lines: list[str], index: int) -> bool:
    return 0 <= index < len(lines) and lines[index].rstrip("\r\n") in _NOTES


def _split(text: str) -> list[str]:
    """Lines with their endings; only ``\\n`` ends a line (as in pip's text-mode reading)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _value_start(line: str) -> int:
    match = re.match(r"\s*.*?\s*[=:]", line)
    return match.end() if match else len(line)


def _meaningful(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and stripped[0] not in "#;"


def url_path(url: str, windows: bool = os.name == "nt") -> str:
    """The path of a ``file:`` URL: ``file:///C:/env/x.txt`` is ``C:/env/x.txt`` on Windows."""
    from urllib.parse import unquote, urlparse

    path = unquote(urlparse(url).path)
    return path[1:] if windows and re.match(r"^/[A-Za-z]:", path) else path


def same_file(token: str, path: Path) -> bool:
    """Whether a constraint list entry (a path or a ``file:`` URL) names ``path``."""
    if token.startswith("file:"):
        token = url_path(token)
    try:
        return os.path.normcase(os.path.abspath(token)) == os.path.normcase(str(path))
    except (TypeError, ValueError):
        return False
