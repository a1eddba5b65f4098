"""``cuda_test`` sites: where a module tests its device against CUDA's name.

``x.device.type == "cuda"``, ``args.device != "cuda"``, ``device.type in ("cuda", "xpu")``,
``"cuda" in str(device)``, ``str(device).startswith("cuda")``, ``match device.type: case "cuda":``,
``{"cuda": ..., "cpu": ...}[device.type]`` (or a name bound to such a display:
``DTYPES[device.type]``, ``device.type in SUPPORTED``) and ``x.is_cuda``: the compared value is
wrapped in ``__dmlpatch__.as_cuda(...)`` (``x.is_cuda`` becomes ``__dmlpatch__.is_cuda(x)``),
inside the test only, so it answers as on CUDA for the adapter dmlpatch gave for ``"cuda"``
(``dmlpatch.runtime.device_tests``). Like ``device_value`` sites these are rewritten only in a
module with other sites: a module whose only CUDA words are tests is device-agnostic code whose
CUDA branches are CUDA's own (its kernels, its streams), not a program that chose CUDA.

A ``match`` whose cases capture a name is left alone: the capture would carry the CUDA name out
of the test.
"""

from __future__ import annotations

import ast
import sys
from typing import Optional, Union

from dmlpatch.rewriting.transform.nodes import is_runtime_call, runtime_call
from dmlpatch.rewriting.transform.walker import Site, Walker

_EQUALITY = (ast.Eq, ast.NotEq)
#: Memory layouts that are CUDA's (Tensor Cores'), not DirectML's.
_CUDA_LAYOUTS = frozenset({"channels_last", "channels_last_3d"})
_MEMBERSHIP = (ast.In, ast.NotIn)
_DISPLAYS = (ast.Tuple, ast.List, ast.Set)


class DeviceTestSites(Walker):
    def site(self, node: Union[ast.expr, ast.stmt], kind: str) -> None:
        super().site(node, kind)
        if kind == "cuda_test":
            self.tested_functions.add(self.scope.function_key())

    #: Names bound (anywhere in the module) to a dict display with CUDA's name as a key, and to
    #: any display (dict, list, tuple, set) that holds it.
    cuda_tables: frozenset[str] = frozenset()
    cuda_collections: frozenset[str] = frozenset()

    def transform(self, tree: ast.Module) -> None:
        tables, collections = _displays_naming_cuda(tree)
        self.cuda_tables, self.cuda_collections = frozenset(tables), frozenset(collections)
        super().transform(tree)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            left, right = operands[i], operands[i + 1]
            if isinstance(op, _EQUALITY) and _is_cuda_name(right):
                operands[i] = self._tested(left)
            elif _is_cuda_name(left):  # "cuda" == x, "cuda" in str(device)
                if isinstance(op, (*_EQUALITY, *_MEMBERSHIP)):
                    operands[i + 1] = self._tested(right)
            elif isinstance(op, _MEMBERSHIP) and self._holds_cuda(right):  # x in ("cuda", ...)
                operands[i] = self._tested(left)
        if any(new is not old for new, old in zip(operands, [node.left, *node.comparators])):
            self.site(node, "cuda_test")
            node.left, node.comparators = operands[0], operands[1:]
        return node

    def prefix_test(self, node: ast.Call) -> bool:
        """``x.startswith("cuda")`` (or a tuple of prefixes with one), rewritten in place."""
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr == "startswith"
            and len(node.args) == 1
            and not node.keywords
            and _holds_cuda_prefix(node.args[0])
        ):
            return False
        wrapped = self._tested(func.value)
        if wrapped is func.value:
            return False
        self.site(node, "cuda_test")
        func.value = wrapped
        return True

    def lookup(self, node: ast.Call) -> bool:
        """``CUDA_TABLE.get(device.type)``, rewritten in place."""
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and node.args
            and self._names_cuda_table(func.value)
        ):
            return False
        wrapped = self._tested(node.args[0])
        if wrapped is node.args[0]:
            return False
        self.site(node, "cuda_test")
        node.args[0] = wrapped
        return True

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and self._names_cuda_table(node.value):
            wrapped = self._tested(node.slice)
            if wrapped is not node.slice:
                self.site(node, "cuda_test")
                node.slice = wrapped
        return node

    if sys.version_info >= (3, 10):

        def visit_Match(self, node: ast.Match) -> ast.AST:
            patterns = [case.pattern for case in node.cases]
            if any(_matches_cuda(p) for p in patterns) and all(
                _captures_nothing(p) for p in patterns
            ):
                wrapped = self._tested(node.subject)
                if wrapped is not node.subject:
                    self.site(node.subject, "cuda_test")
                    node.subject = wrapped
            return node

    def cuda_layout_branch(self, node: ast.If) -> None:
        """``if device.type == "cuda": model.to(memory_format=torch.channels_last)``: NHWC is
        CUDA's Tensor-Core layout (ultralytics: "numerically wrong on MPS"), not DirectML's, so
        a test whose branches change to it stays as written (its sites are taken back)."""
        if not any(
            isinstance(inner, ast.Attribute) and inner.attr in _CUDA_LAYOUTS
            for branch in (*node.body, *node.orelse)
            for inner in ast.walk(branch)
        ):
            return
        taken = {id(n) for n in ast.walk(node.test) if _is_test_call(n)}
        if not taken:
            return
        node.test = _untested(node.test)
        self.sites = [
            site
            for site in self.sites
            if not (site.kind == "cuda_test" and _within(site, node.test))
        ]

    def is_cuda_attribute(self, node: ast.Attribute) -> Optional[ast.expr]:
        """``x.is_cuda`` → ``__dmlpatch__.is_cuda(x)``; None for any other attribute."""
        if not (
            node.attr == "is_cuda" and isinstance(node.ctx, ast.Load) and self.is_object(node.value)
        ):
            return None
        self.site(node, "cuda_test")
        return runtime_call("is_cuda", [node.value], node)

    def _tested(self, node: ast.expr) -> ast.expr:
        """``__dmlpatch__.as_cuda(node)``, unless ``node`` is a literal (or rewritten already)."""
        if isinstance(node, (ast.Constant, ast.JoinedStr, *_DISPLAYS, ast.Dict)):
            return node
        if is_runtime_call(node):
            return node
        return runtime_call("as_cuda", [node], node)

    def _holds_cuda(self, node: ast.expr) -> bool:
        if isinstance(node, _DISPLAYS):
            return any(_is_cuda_name(item) for item in node.elts)
        if isinstance(node, ast.Dict):
            return _has_cuda_key(node)
        return _bound_name(node) in self.cuda_collections

    def _names_cuda_table(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Dict):
            return _has_cuda_key(node)
        return _bound_name(node) in self.cuda_tables


def _bound_name(node: ast.expr) -> Optional[str]:
    """``TABLE``, ``self.TABLE``, ``module.TABLE``: the name a display may be bound to."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _has_cuda_key(node: ast.Dict) -> bool:
    return any(key is not None and _is_cuda_name(key) for key in node.keys)


def _is_cuda_name(node: ast.expr) -> bool:
    """``"cuda"`` or ``"cuda:N"``."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    kind, colon, index = node.value.partition(":")
    return kind == "cuda" and (not colon or index.isdigit())


def _holds_cuda_prefix(node: ast.expr) -> bool:
    def prefix(item: ast.expr) -> bool:
        return (
            isinstance(item, ast.Constant)
            and isinstance(item.value, str)
            and item.value.startswith("cuda")
        )

    if isinstance(node, ast.Tuple):
        return any(prefix(item) for item in node.elts)
    return prefix(node)


def _displays_naming_cuda(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names and attributes assigned a dict display keyed by CUDA's name (``X = {"cuda": ...}``),
    and those assigned any display that holds it (``self.SUPPORTED = ("cuda", "cpu")``)."""
    tables: set[str] = set()
    collections: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        table = isinstance(value, ast.Dict) and _has_cuda_key(value)
        if not table and not (
            isinstance(value, _DISPLAYS) and any(_is_cuda_name(item) for item in value.elts)
        ):
            continue
        for target in targets:
            name = _bound_name(target)
            if name is not None:
                collections.add(name)
                if table:
                    tables.add(name)
    return tables, collections


if sys.version_info >= (3, 10):

    def _matches_cuda(pattern: ast.pattern) -> bool:
        if isinstance(pattern, ast.MatchValue):
            return _is_cuda_name(pattern.value)
        if isinstance(pattern, ast.MatchOr):
            return any(_matches_cuda(p) for p in pattern.patterns)
        return False

    def _captures_nothing(pattern: ast.pattern) -> bool:
        """Literals, ``a | b`` of literals and the wildcard ``_``."""
        if isinstance(pattern, ast.MatchValue):
            return True
        if isinstance(pattern, ast.MatchOr):
            return all(_captures_nothing(p) for p in pattern.patterns)
        return isinstance(pattern, ast.MatchAs) and pattern.pattern is None and pattern.name is None


def _is_test_call(node: ast.AST) -> bool:
    """``__dmlpatch__.as_cuda(x)`` or ``__dmlpatch__.is_cuda(x)``."""
    return (
        isinstance(node, ast.Call)
        and is_runtime_call(node)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("as_cuda", "is_cuda")
    )


class _Untest(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        if not _is_test_call(node):
            return node
        assert isinstance(node.func, ast.Attribute)
        value = node.args[0]
        if node.func.attr == "is_cuda":
            return ast.copy_location(ast.Attribute(value, "is_cuda", ast.Load()), node)
        return value


def _untested(test: ast.expr) -> ast.expr:
    """``test`` with its device tests as the program wrote them."""
    result: ast.expr = _Untest().visit(test)
    return result


def _within(site: Site, test: ast.expr) -> bool:
    first, last = test.lineno, test.end_lineno or test.lineno
    return first <= site.line <= last
