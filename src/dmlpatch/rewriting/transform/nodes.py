"""Reading and building the syntax tree: source segments, the runtime calls that replace a
site, and where new nodes sit (every new node takes the place of what it replaces, so
tracebacks keep pointing at the original lines)."""

from __future__ import annotations

import ast
from typing import Optional, TypeVar, Union

from dmlpatch.runtime import ALIAS, KEPT_ALIAS

Node = TypeVar("Node", bound=ast.AST)


class Lines:
    """Source text by line, for the ``text`` of a site (AST columns count UTF-8 bytes)."""

    def __init__(self, source: Union[str, bytes]) -> None:
        if isinstance(source, bytes):
            # decode_source honours the coding cookie and translates newlines like the parser.
            from importlib.util import decode_source

            text = decode_source(source)
        else:
            text = source.replace("\r\n", "\n").replace("\r", "\n")
        self._lines = [line.encode("utf-8") for line in text.split("\n")]

    def segment(self, node: Union[ast.expr, ast.stmt]) -> str:
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        end_col = node.end_col_offset if node.end_col_offset is not None else None
        if first == last:
            return self._lines[first][node.col_offset : end_col].decode("utf-8", "replace")
        parts = [self._lines[first][node.col_offset :], *self._lines[first + 1 : last]]
        parts.append(self._lines[last][:end_col])
        return b"\n".join(parts).decode("utf-8", "replace")


def keyword(node: ast.Call, name: str) -> Optional[ast.keyword]:
    return next((keyword for keyword in node.keywords if keyword.arg == name), None)


def dotted(node: ast.expr, torch_names: set[str]) -> Optional[str]:
    """``torch.a.b`` (``torch`` under any of its bound names) as ``"a.b"``; else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in torch_names and parts:
        return ".".join(reversed(parts))
    return None


def alias(name: str) -> ast.Attribute:
    """``__dmlpatch__.<name>``."""
    return ast.Attribute(ast.Name(ALIAS, ast.Load()), name, ast.Load())


def is_runtime_call(node: ast.expr) -> bool:
    """``__dmlpatch__.<name>(...)``: rewritten already (rewriting twice changes nothing)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in (ALIAS, KEPT_ALIAS)
    )


def runtime_call(name: str, args: list[ast.expr], like: ast.expr) -> ast.Call:
    """``__dmlpatch__.<name>(*args)`` in the place of ``like``, its callee on ``like``'s first line.

    CPython reports a call through an attribute that spans lines at the attribute's last
    line: a callee spanning a multi-line literal would move the call, and the traceback line,
    to the literal's closing line.
    """
    callee = located(alias(name), like)
    for part in (callee, callee.value):
        part.end_lineno, part.end_col_offset = part.lineno, part.col_offset
    return located(ast.Call(callee, args, []), like)


def located(node: Node, like: ast.AST) -> Node:
    """Give ``node`` and its new descendants the location of ``like``; kept nodes keep theirs."""
    for child in ast.walk(node):
        if "lineno" in child._attributes and getattr(child, "lineno", None) is None:
            ast.copy_location(child, like)
    return node


def insert_runtime_import(tree: ast.Module, runtime: str, name: str) -> None:
    """``import <runtime> as <name>`` after the docstring and ``__future__``."""
    body = tree.body
    index = 0
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        index = 1 if isinstance(first.value.value, str) else 0
    while index < len(body):
        statement = body[index]
        if not (isinstance(statement, ast.ImportFrom) and statement.module == "__future__"):
            break
        index += 1
    # The import borrows the line of the statement it precedes: it has no line of its own.
    anchor = body[min(index, len(body) - 1)]
    statement = ast.Import([ast.alias(runtime, name)])
    body.insert(index, located(statement, anchor))


def uses_name(tree: ast.Module, name: str) -> bool:
    return any(isinstance(node, ast.Name) and node.id == name for node in ast.walk(tree))
