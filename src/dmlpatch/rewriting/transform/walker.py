"""The walk every site kind is found on: each node after its children, without recursion,
knowing the function or class around it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import NamedTuple, Optional, Union

from dmlpatch.rewriting.transform.names import ImportedNames
from dmlpatch.rewriting.transform.nodes import Lines
from dmlpatch.runtime import ALIAS, KEPT_ALIAS


class Site(NamedTuple):
    """One rewritten place: where it starts (1-based line, UTF-8 byte column), what it is."""

    line: int
    col: int
    kind: str
    text: str


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


class Scope:
    """A function or class around a node (the module's own code: ``node`` None), named by the
    dotted names of the definitions around it."""

    __slots__ = ("is_function", "name", "node", "outer")

    def __init__(self, node: Optional[ast.AST], outer: Optional[Scope], name: str) -> None:
        self.node = node
        self.outer = outer
        self.name = name
        self.is_function = isinstance(node, FUNCTIONS)

    @classmethod
    def of(cls, node: ast.AST, outer: Scope) -> Scope:
        """The scope of ``node``'s children."""
        if not isinstance(node, (*FUNCTIONS, ast.ClassDef)):
            return outer
        own = "<lambda>" if isinstance(node, ast.Lambda) else node.name
        return cls(node, outer, f"{outer.name}.{own}" if outer.name else own)

    def chain(self) -> Iterator[Scope]:
        scope: Optional[Scope] = self
        while scope is not None:
            yield scope
            scope = scope.outer

    def depth(self) -> int:
        return sum(1 for _ in self.chain())

    def function_key(self) -> int:
        """The innermost function around (by identity; 0: the module's own code)."""
        return next((id(s.node) for s in self.chain() if s.is_function), 0)


#: A node on the walk's stack: the node, its parent, the parent's field (and list index) that
#: holds it, and whether its children are done.
Entry = tuple[ast.AST, ast.AST, str, Optional[int], bool]

#: Nodes the walk need not enter (most of a tree): no visitor, nor any inside them.
LEAVES = frozenset(
    {
        ast.Name,
        ast.Constant,
        ast.alias,
        *ast.expr_context.__subclasses__(),
        *ast.operator.__subclasses__(),
        *ast.boolop.__subclasses__(),
        *ast.unaryop.__subclasses__(),
        *ast.cmpop.__subclasses__(),
    }
)


def children(node: ast.AST) -> list[Entry]:
    """Stack entries for the children of ``node``, last first: the walk visits the first first."""
    entries: list[Entry] = []
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, ast.AST) and type(item) not in LEAVES:
                    entries.append((item, node, field, index, False))
        elif isinstance(value, ast.AST) and type(value) not in LEAVES:
            entries.append((value, node, field, None, False))
    entries.reverse()
    return entries


class Walker:
    """Visits every node after its children, like ``ast.NodeTransformer``, but without recursion.

    The parser accepts expressions nested deeper than Python's recursion limit allows a
    recursive visitor to follow (sympy's generated ``resolvent_lookup.py`` nests polynomials
    ~570 levels deep), and the rewriter must never fail on a file that compiles. Each site kind
    adds its ``visit_<Type>`` methods in a class of its own (``dmlpatch.rewriting.transform``).
    """

    def __init__(self, names: ImportedNames, lines: Lines, cuda_api: Optional[str]) -> None:
        self.names = names
        self.lines = lines
        #: The module ``from torch.cuda import ...`` is pointed at (None: kept as written).
        self.cuda_api = cuda_api
        self.sites: list[Site] = []
        self.unanswered: set[str] = set()
        #: The scope of the node being visited, and the functions (by id; 0: the module's own
        #: code) that use an unanswered name, with their scope and those names.
        self.scope = Scope(None, None, "")
        self.tainted: dict[int, tuple[Scope, set[str]]] = {}
        #: Functions (by ``Scope.function_key``) that test a device against CUDA's name, and
        #: those that look a device's torch module up at run time (``getattr(torch, x)``).
        self.tested_functions: set[int] = set()
        self.device_modules: dict[int, Scope] = {}
        #: Whether the module names a legacy CUDA tensor type, and its ``x.type(T)`` calls.
        self.legacy_types = False
        self.type_calls: list[ast.Call] = []

    def transform(self, tree: ast.Module) -> None:
        """Call ``visit_<Type>`` on each node, children first; put what it returns in its place."""
        visitors = {
            getattr(ast, name[len("visit_") :]): getattr(self, name)
            for name in dir(self)
            # ast.Match is Python 3.10's: on 3.9 there are no such nodes to visit.
            if name.startswith("visit_") and hasattr(ast, name[len("visit_") :])
        }
        root = self.scope
        stack: list[tuple[Entry, Scope]] = [((tree, tree, "", None, False), root)]
        bound = self.names.unanswered
        while stack:
            entry, scope = stack.pop()
            node, parent, field, index, children_done = entry
            if not children_done:
                stack.append(((node, parent, field, index, True), scope))
                inner = Scope.of(node, scope)
                if bound:
                    for child in ast.iter_child_nodes(node):
                        if isinstance(child, ast.Name) and child.id in bound:
                            self.unanswered_use(bound[child.id], inner)
                stack += [(child, inner) for child in children(node)]
                continue
            self.scope = scope
            visitor = visitors.get(type(node))
            replacement = visitor(node) if visitor is not None else node
            if replacement is node:
                continue
            if index is None:
                setattr(parent, field, replacement)
            else:
                getattr(parent, field)[index] = replacement
        self.finish()

    def finish(self) -> None:
        """What a site kind does once the whole tree is walked."""

    def unanswered_use(self, name: str, scope: Scope) -> None:
        """``name``, a ``torch.cuda`` name the runtime does not answer, is used in ``scope``."""
        self.unanswered.add(name)

    def site(self, node: Union[ast.expr, ast.stmt], kind: str) -> None:
        self.sites.append(Site(node.lineno, node.col_offset, kind, self.lines.segment(node)))

    def is_object(self, node: ast.expr) -> bool:
        """Not ``torch`` nor a class under it (``torch.Tensor.cuda(x)`` is unbound), nor us."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return not (
            isinstance(node, ast.Name)
            and (node.id in self.names.torch or node.id in (ALIAS, KEPT_ALIAS))
        )
