"""The names rewritten code reaches the runtime by are spelled once, in ``dmlpatch.runtime``:
the rewriter writes them, the import hook, discovery, start-up and the missed-site check read
them, and a name spelled twice could drift apart from the code that writes it."""

from __future__ import annotations

import ast
from pathlib import Path

import dmlpatch
from dmlpatch import runtime

SOURCE = Path(dmlpatch.__file__).parent
NAMES = {
    runtime.SITES: "dmlpatch.runtime.sites",
    runtime.ALIAS: "__dmlpatch__",
    runtime.AS_WRITTEN: "dmlpatch.runtime.as_written",
    runtime.KEPT_ALIAS: "__dmlpatch_kept__",
    runtime.CUDA_API: "dmlpatch.runtime.cuda_api",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes in ``tree`` (prose may name the modules)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def test_the_names_are_what_rewritten_code_has_always_imported() -> None:
    assert all(name == spelled for name, spelled in NAMES.items())
    assert runtime.PACKAGE == "dmlpatch.runtime"


def test_no_other_module_spells_them() -> None:
    spelled_in = {}
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in prose:
                spelled_in.setdefault(node.value, []).append(str(path.relative_to(SOURCE)))
    assert spelled_in == {name: ["runtime/__init__.py"] for name in NAMES}
