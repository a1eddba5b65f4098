"""No import cycles among dmlpatch's modules.

The graph is built from the source, not by importing it: an edge ``a -> b`` is any statement of
``a`` that imports ``b`` (``import dmlpatch.b``, ``from dmlpatch import b``, ``from dmlpatch.b
import name``, relative forms alike), wherever it stands. Imports inside functions count as
much as those at the top: a lazy import only moves the moment the cycle closes to a call, where
it fails as a half-initialised module just as well, and a reader still has to hold both modules
in mind to understand either. Imports under ``if TYPE_CHECKING:`` count for cycles too: they never
run, but a module that names another's types depends on it all the same, and a cycle hidden that
way (resolution -> operator fixes -> allocation -> announcement -> resolution) was one. Not
counted: modules named in strings and imported dynamically (a rewritten module's runtime), and the
package a module belongs to (importing ``a.b`` runs ``a/__init__`` first; that is how packages
are built, and an explicit ``from a import name`` is counted like any other import).
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "dmlpatch"


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module under ``root``."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        modules[".".join(parts)] = (path, package)
    return modules


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _imported(node: ast.AST, package: str) -> list[str]:
    """The dotted names one import statement imports: ``a.b`` for ``import a.b`` and for
    ``from a import b`` (a module, or an attribute of ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    return [f"{module}.{alias.name}" for alias in node.names]


def import_graph(root: Path, type_checking: bool = True) -> dict[str, set[str]]:
    """Each module of the package at ``root`` -> the package's modules it imports; with
    ``type_checking`` False, only those imports that run (not under ``if TYPE_CHECKING:``)."""
    modules = _modules(root)
    top = root.name

    def resolve(name: str) -> str:
        """The module ``name`` is, or the module ``name`` is an attribute of."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), str(path))]
        while pending:
            node = pending.pop()
            for child in ast.iter_child_nodes(node):
                if not type_checking and _is_type_checking(child):
                    assert isinstance(child, ast.If)
                    pending.extend(child.orelse)  # the else branch runs
                    continue
                for imported in _imported(child, package):
                    if imported.startswith(top + "."):
                        edges.add(resolve(imported))
                pending.append(child)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm),
    each sorted, each one or more cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(f"{name} -> {', '.join(sorted(graph[name] & members))}" for name in component)


def test_no_module_of_dmlpatch_imports_itself_back() -> None:
    graph = import_graph(SOURCE)
    assert len(graph) > 100  # the whole package was read
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(c, graph) for c in found)


def test_a_lazy_cycle_through_a_package_is_found(tmp_path: Path) -> None:
    """The check itself: a cycle closed by an import inside a function, through a package's
    relative import, is reported; so is one closed under TYPE_CHECKING."""
    package = tmp_path / "dmlpatch"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from dmlpatch.inner import b\n")
    (package / "inner" / "b.py").write_text("def f():\n    from .. import c\n")
    (package / "c.py").write_text("def g():\n    import dmlpatch.a\n")
    (package / "d.py").write_text(
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from dmlpatch import e\n"
    )
    (package / "e.py").write_text("from dmlpatch import d\n")
    graph = import_graph(package)
    assert cycles(graph) == [
        ["dmlpatch.a", "dmlpatch.c", "dmlpatch.inner.b"],
        ["dmlpatch.d", "dmlpatch.e"],
    ]
    assert cycles(import_graph(package, type_checking=False)) == [
        ["dmlpatch.a", "dmlpatch.c", "dmlpatch.inner.b"]
    ]


def test_the_runtime_never_imports_the_rewriter() -> None:
    """Rewritten code runs ``dmlpatch.runtime``; the rewriter only reads its name lists. A
    runtime module importing the rewriter would load the parser into every rewritten call."""
    graph = import_graph(SOURCE, type_checking=False)
    runtime = {
        name: imports for name, imports in graph.items() if name.startswith("dmlpatch.runtime")
    }
    assert len(runtime) >= 8
    reaching = {
        name: sorted(i for i in imports if i.startswith("dmlpatch.rewriting"))
        for name, imports in runtime.items()
    }
    assert not any(reaching.values()), reaching


def test_resolving_a_device_installs_nothing() -> None:
    """The device package answers where work runs; what committing to an answer sets up (the
    operator fixes) is start-up's hook, so no device module reaches the fixes."""
    graph = import_graph(SOURCE)
    devices = {
        name: imports for name, imports in graph.items() if name.startswith("dmlpatch.devices")
    }
    assert "dmlpatch.devices.resolution" in devices
    reaching = {
        name: sorted(i for i in imports if i.startswith(("dmlpatch.opfix", "dmlpatch.startup")))
        for name, imports in devices.items()
    }
    assert not any(reaching.values()), reaching
