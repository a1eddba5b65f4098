"""``complex_literal`` sites: arithmetic between a complex literal and another value."""

from __future__ import annotations

import ast

from dmlpatch.rewriting.transform.nodes import located, runtime_call
from dmlpatch.rewriting.transform.walker import Walker

_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ComplexSites(Walker):
    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        """``x * 1j``: see ``complex_literal`` in ``dmlpatch.rewriting.transform``."""
        symbol = _OPERATORS.get(type(node.op))
        if symbol is None or not self.names.imports_torch:
            return node
        if not (_complex_literal(node.left) or _complex_literal(node.right)):
            return node
        if _number(node.left) and _number(node.right):
            return node  # 3.14 + 2.71j is a Python number, folded into one constant
        self.site(node, "complex_literal")
        args = [located(ast.Constant(symbol), node), node.left, node.right]
        return runtime_call("with_complex", args, node)


def _complex_literal(node: ast.expr) -> bool:
    """``1j``, ``-2.5j``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, complex)


def _number(node: ast.expr) -> bool:
    """A numeric literal, signed or not (``3``, ``-2.5``, ``1j``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float, complex))
        and not isinstance(node.value, bool)
    )
