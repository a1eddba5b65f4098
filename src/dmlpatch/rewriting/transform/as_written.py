"""First do no harm, per function: the sites of a function that also uses a ``torch.cuda`` name
the runtime does not answer, or a name imported from a library that runs only on CUDA
(``triton``, ``mamba_ssm``, ``flash_attn``...), go to ``dmlpatch.runtime.as_written``, which
keeps CUDA's meaning."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from typing import Any, Optional, cast

from dmlpatch.rewriting.transform.nodes import located
from dmlpatch.rewriting.transform.walker import FUNCTIONS, Scope, Walker
from dmlpatch.runtime import ALIAS, CUDA_API, KEPT_ALIAS, PACKAGE

CUDA_API_MODULE = CUDA_API
#: ``from torch import accelerator`` is rewritten to import it from here.
RUNTIME_PACKAGE = PACKAGE


class KeptAsWritten(Walker):
    def unanswered_use(self, name: str, scope: Scope) -> None:
        """The innermost function around the use, and the functions around that, keep CUDA's
        meaning (the module's own code where no function is around it)."""
        super().unanswered_use(name, scope)
        functions = [s for s in scope.chain() if s.is_function]
        owners: list[Optional[Scope]] = [*functions] or [None]
        for function in owners:
            key = id(function.node) if function is not None else 0
            held = self.tainted.setdefault(key, (function or Scope(None, None, ""), set()))
            held[1].add(name)

    def keep_tainted(self, tree: ast.Module) -> list[tuple[str, tuple[str, ...]]]:
        """Route the sites of every tainted function (innermost first) to the runtime that
        keeps CUDA's meaning; the functions that had sites, with the names that kept them."""
        kept: list[tuple[str, tuple[str, ...]]] = []
        order = sorted(self.tainted.values(), key=lambda held: -held[0].depth())
        for scope, names in order:
            uses = tuple(sorted(names))
            name = scope.name or "<module>"
            if scope.node is None:
                count = _keep(_module_code(tree), name, uses, imports=False)
            else:
                count = _keep(ast.walk(scope.node), name, uses, imports=True)
            if count:
                kept.append((name, uses))
        return sorted(kept)


def _module_code(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node of the module's own code (class bodies included), no function's."""
    queue: deque[ast.AST] = deque([tree])
    while queue:
        node = queue.popleft()
        yield node
        queue.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, FUNCTIONS))


def _keep(nodes: Iterator[ast.AST], scope: str, uses: tuple[str, ...], imports: bool) -> int:
    """Point the runtime calls among ``nodes`` at the runtime that keeps CUDA's meaning; its
    ``is_available()`` and ``as_cuda()`` are told the scope and the names, to say why in one
    line. Imports of
    ``cuda_api``'s answers go back to ``torch.cuda`` (with ``imports``). Returns how many
    runtime references there are, rerouted here or before (by an inner function)."""
    count = 0
    for node in nodes:
        if isinstance(node, ast.Name) and node.id in (ALIAS, KEPT_ALIAS):
            count += 1
            node.id = KEPT_ALIAS
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("is_available", "as_cuda")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == ALIAS
            and not node.keywords
        ):
            node.keywords = [
                located(ast.keyword("scope", ast.Constant(scope)), node),
                # A tuple of constants is a constant to the compiler; typeshed lists scalars only.
                located(ast.keyword("uses", ast.Constant(cast(Any, uses))), node),
            ]
        elif imports and isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == CUDA_API_MODULE:
                node.module = "torch.cuda"
            elif node.module == RUNTIME_PACKAGE:
                node.module = "torch"
    return count
