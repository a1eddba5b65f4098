"""What a module's imports bind: ``torch``, ``torch.cuda``, its functions, ``torch.device``."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from typing import Optional

from dmlpatch.rewriting.transform import device_parameters
from dmlpatch.runtime.cuda_names import NAMES
from dmlpatch.runtime.cuda_only import LIBRARIES as CUDA_ONLY_LIBRARIES
from dmlpatch.runtime.sites import CUDA_FUNCTIONS, HARMLESS_CUDA_NAMES

#: ``torch.device``, whose arguments (``type=``, ``index=``) make a device rather than take one.
TORCH_DEVICE_FUNCTIONS = frozenset({"device"})
#: Callees of the ``amp`` sites, by the runtime function that takes them.
AMP = {"autocast": "autocast", "GradScaler": "grad_scaler"}
#: Modules whose autocast / GradScaler the ``amp`` sites take.
AMP_MODULES = frozenset({"torch", "torch.amp", "torch.cuda.amp"})
#: ``torch.cuda.amp``'s decorators for custom autograd functions, CUDA's by name.
CUSTOM_AMP = frozenset({"custom_fwd", "custom_bwd"})
#: ``from torch.cuda.random import get_rng_state``: imported from ``cuda_api`` instead.
ANSWERED_SUBMODULE = "torch.cuda.random"


def unanswered(name: str) -> bool:
    """A ``torch.cuda`` name that fails without a CUDA GPU and that the runtime does not route."""
    return (
        name not in CUDA_FUNCTIONS
        and name not in NAMES
        and name not in HARMLESS_CUDA_NAMES
        and name != "*"
    )


class ImportedNames:
    """The names a module's imports bind to torch and its CUDA API.

    Scopes are not tracked: a module that rebinds ``torch`` to something else is not worth the
    complexity, and the runtime returns non-CUDA values unchanged anyway. (A plain class: the
    runner rewrites every main script, and dataclasses costs ~6 ms to import.)
    """

    def __init__(self) -> None:
        self.torch: set[str] = {"torch"}
        self.cuda: set[str] = set()
        self.cuda_functions: dict[str, str] = {}
        self.torch_functions: dict[str, str] = {}
        self.inference_mode: set[str] = set()
        #: Bound names of ``torch.amp`` / ``torch.cuda.amp`` and of their autocast/GradScaler.
        self.amp_modules: set[str] = set()
        self.amp_callees: dict[str, str] = {}
        #: Bound names of ``torch.cuda.amp`` and of its ``custom_fwd`` / ``custom_bwd``.
        self.cuda_amp_modules: set[str] = set()
        self.custom_amp: set[str] = set()
        #: Names bound by ``from torch.cuda import X`` (or ``from torch.cuda.X import ...``)
        #: for an unanswered X, and that X; and names bound by imports of libraries that run
        #: only on CUDA (``import triton``, ``from mamba_ssm import selective_scan_fn``), with
        #: what they import: where they are used, CUDA's meaning is kept.
        self.unanswered: dict[str, str] = {}
        #: Whether the module imports torch (or a submodule): complex literals are sites then.
        self.imports_torch = False
        #: Names bound to a torch submodule (``import torch.nn as nn``, ``from torch.utils
        #: import data``) and to a torch callable with device parameters (``from torch import
        #: Generator``), with the qualified name each stands for.
        self.torch_modules: dict[str, str] = {}
        self.torch_callables: dict[str, str] = {}

    def qualified(self, func: ast.expr) -> Optional[str]:
        """The torch name a callee spells (``torch.jit.load``, ``nn.Linear`` under ``from
        torch import nn``, ``Generator`` under ``from torch import Generator``), else None."""
        if isinstance(func, ast.Name):
            return self.torch_callables.get(func.id)
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or not parts:
            return None
        if func.id in self.torch:
            root = "torch"
        else:
            found = self.torch_modules.get(func.id)
            if found is None:
                return None
            root = found
        return ".".join([root, *reversed(parts)])

    def bind_torch_name(self, bound: str, qualified: str) -> None:
        """``from torch.x import y as bound``: a callable with device parameters, or a module
        whose callables have some."""
        if qualified in device_parameters.FUNCTIONS:
            self.torch_callables[bound] = qualified
        elif qualified in device_parameters.MODULES:
            self.torch_modules[bound] = qualified

    @classmethod
    def of(cls, tree: ast.Module) -> ImportedNames:
        names = cls()
        for node in statements(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in CUDA_ONLY_LIBRARIES:
                        bound = alias.asname or alias.name.split(".")[0]
                        names.unanswered[bound] = alias.name if alias.asname else bound
                    names.imports_torch |= alias.name.split(".")[0] == "torch"
                    if alias.name == "torch" or (
                        alias.name.startswith("torch.") and alias.asname is None
                    ):
                        names.torch.add(alias.asname or "torch")
                    elif alias.name == "torch.cuda":
                        names.cuda.add(alias.asname or "cuda")
                    elif alias.name.startswith("torch.") and alias.asname:
                        names.torch_modules[alias.asname] = alias.name
                    if alias.name in ("torch.amp", "torch.cuda.amp") and alias.asname:
                        names.amp_modules.add(alias.asname)
                    if alias.name == "torch.cuda.amp" and alias.asname:
                        names.cuda_amp_modules.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                if (node.module or "").split(".")[0] in CUDA_ONLY_LIBRARIES:
                    for alias in node.names:
                        if alias.name != "*":
                            names.unanswered[alias.asname or alias.name] = (
                                f"{node.module}.{alias.name}"
                            )
                names.imports_torch |= (node.module or "").split(".")[0] == "torch"
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if (node.module or "").split(".")[0] == "torch" and alias.name != "*":
                        names.bind_torch_name(bound, f"{node.module}.{alias.name}")
                    if node.module == "torch" and alias.name == "cuda":
                        names.cuda.add(bound)
                    elif node.module == "torch" and alias.name in TORCH_DEVICE_FUNCTIONS:
                        names.torch_functions[bound] = alias.name
                    elif node.module == "torch" and alias.name == "inference_mode":
                        names.inference_mode.add(bound)
                    elif node.module in ("torch", "torch.cuda") and alias.name == "amp":
                        names.amp_modules.add(bound)
                        if node.module == "torch.cuda":
                            names.cuda_amp_modules.add(bound)
                    elif node.module == "torch.cuda.amp" and alias.name in CUSTOM_AMP:
                        names.custom_amp.add(bound)
                    elif node.module in AMP_MODULES and alias.name in AMP:
                        names.amp_callees[bound] = AMP[alias.name]
                    elif node.module == "torch.cuda" and alias.name in CUDA_FUNCTIONS:
                        names.cuda_functions[bound] = alias.name
                    elif node.module == "torch.cuda" and unanswered(alias.name):
                        names.unanswered[bound] = alias.name
                if node.module and node.module.startswith("torch.cuda."):
                    # torch.cuda.random's names are answered under their submodule's
                    # (cuda_api holds them all); nvtx's are answered only as torch.cuda.nvtx.
                    submodule = node.module.split(".")[2]
                    if node.module != ANSWERED_SUBMODULE and (
                        unanswered(submodule) or submodule in NAMES
                    ):
                        for alias in node.names:
                            names.unanswered[alias.asname or alias.name] = submodule
        return names


#: What holds statements; expressions hold none, so imports are found without walking them.
BLOCKS = tuple(
    getattr(ast, name) for name in ("stmt", "excepthandler", "match_case") if hasattr(ast, name)
)


def statements(tree: ast.Module) -> Iterator[ast.AST]:
    """The statements of ``tree`` (and what holds them) in ``ast.walk``'s order."""
    queue: deque[ast.AST] = deque([tree])
    while queue:
        node = queue.popleft()
        yield node
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                queue.extend(item for item in value if isinstance(item, BLOCKS))
