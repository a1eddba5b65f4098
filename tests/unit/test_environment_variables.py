"""One list of the environment variables dmlpatch reads or sets
(``dmlpatch.environment_variables``): the documentation's table
(docs/reference/environment-variables.md) is that list, and no other module of the package
spells a ``DMLPATCH_`` name in its code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from dmlpatch import environment_variables

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "environment-variables.md"
PACKAGE = REPO / "src" / "dmlpatch"
REGISTRY = PACKAGE / "environment_variables.py"

_NAME = re.compile(r"DMLPATCH_[A-Z0-9_]+")


def _registry() -> dict[str, str]:
    return dict(environment_variables.MEANINGS)


def _documented_table() -> dict[str, str]:
    """The rows of the documentation's environment variables table: name -> meaning."""
    section = PAGE.read_text(encoding="utf-8")
    rows = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| `([A-Z0-9_]+)` \| (.+) \|", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} is in the table twice"
            rows[match.group(1)] = match.group(2)
    return rows


def _expected_table() -> str:
    return "\n".join(f"| `{name}` | {meaning} |" for name, meaning in _registry().items())


def test_every_constant_is_its_own_name_and_has_a_meaning() -> None:
    constants = {
        name: value
        for name, value in vars(environment_variables).items()
        if name.isupper() and isinstance(value, str)
    }
    assert all(name == value for name, value in constants.items())
    assert set(constants) == set(_registry())
    assert all(meaning.strip() for meaning in _registry().values())


def test_the_documented_table_is_the_registry() -> None:
    """Same names, same meanings, same order; the message is the table to paste."""
    assert list(_documented_table().items()) == list(_registry().items()), (
        "docs/reference/environment-variables.md's table differs from "
        "dmlpatch.environment_variables.MEANINGS; it should read:\n" + _expected_table()
    )


def _code_strings(tree: ast.Module) -> list[ast.Constant]:
    """String constants that are code, not documentation (docstrings left out)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def spelled_elsewhere(package: Path, registry: Path) -> list[str]:
    """``file:line: NAME`` for each ``DMLPATCH_`` name a string in the code of a module other
    than ``registry`` spells (f-strings' literal parts included; comments and docstrings, which
    only name a variable for a reader, are not code)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == registry:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _code_strings(tree):
            for name in _NAME.findall(node.value):
                found.append(f"{path.relative_to(package)}:{node.lineno}: {name}")
    return found


def test_no_other_module_spells_a_variable_name() -> None:
    assert spelled_elsewhere(PACKAGE, REGISTRY) == []


def test_a_spelled_name_is_found(tmp_path: Path) -> None:
    """The check itself: in a call, in an f-string's text; not in a docstring or comment."""
    (tmp_path / "registry.py").write_text('DMLPATCH_X = "DMLPATCH_X"\n')
    (tmp_path / "user.py").write_text(
        '"""Reads $DMLPATCH_DOC."""\n'
        "import os\n"
        "# DMLPATCH_COMMENT\n"
        'os.environ.get("DMLPATCH_X")\n'
        'message = f"{os.sep}: set DMLPATCH_Y"\n'
    )
    assert spelled_elsewhere(tmp_path, tmp_path / "registry.py") == [
        "user.py:4: DMLPATCH_X",
        "user.py:5: DMLPATCH_Y",
    ]


def test_every_variable_is_used() -> None:
    """A variable nothing reads or sets any more leaves the list (and the documentation)."""
    sources = "\n".join(
        path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py") if path != REGISTRY
    )
    unused = [name for name in _registry() if not re.search(rf"\b{name}\b", sources)]
    assert unused == []
