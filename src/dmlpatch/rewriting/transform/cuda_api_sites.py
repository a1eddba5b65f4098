"""``is_available``, ``cuda_api``, ``tensor_type`` and ``accelerator`` sites: ``torch.cuda``'s
API and ``torch.accelerator``, answered by ``dmlpatch.runtime``; the other ``torch.cuda`` names
are noted as unanswered (``dmlpatch.rewriting.transform.as_written``)."""

from __future__ import annotations

import ast
from typing import Optional

from dmlpatch.rewriting.transform.as_written import RUNTIME_PACKAGE
from dmlpatch.rewriting.transform.names import ANSWERED_SUBMODULE, unanswered
from dmlpatch.rewriting.transform.nodes import alias, located
from dmlpatch.rewriting.transform.walker import Walker
from dmlpatch.runtime.cuda_names import LEGACY_TYPE_NAMES, NAMES
from dmlpatch.runtime.sites import CUDA_FUNCTIONS

#: How a dynamic ``getattr(torch, <device type>)`` is named where it keeps a function as written.
DEVICE_MODULE = "torch.<device type> (getattr)"


class CudaApiSites(Walker):
    def cuda_attribute(self, node: ast.Attribute) -> ast.expr:
        """``torch.accelerator`` and the answered ``torch.cuda.<name>`` are rerouted; other
        ``torch.cuda`` names that fail without CUDA are noted and left as they are."""
        owner = node.value
        if (
            node.attr == "accelerator"
            and isinstance(owner, ast.Name)
            and owner.id in self.names.torch
            and isinstance(node.ctx, ast.Load)
        ):
            self.site(node, "accelerator")
            return located(alias("accelerator"), node)
        of_cuda = (
            isinstance(owner, ast.Attribute)
            and owner.attr == "cuda"
            and isinstance(owner.value, ast.Name)
            and owner.value.id in self.names.torch
        ) or (isinstance(owner, ast.Name) and owner.id in self.names.cuda)
        if of_cuda and node.attr in NAMES and isinstance(node.ctx, ast.Load):
            self.legacy_types |= node.attr in LEGACY_TYPE_NAMES
            self.site(node, "cuda_api")
            routed = ast.Attribute(alias("torch_cuda"), node.attr, ast.Load())
            return located(routed, node)
        if of_cuda and unanswered(node.attr):
            self.unanswered_use(node.attr, self.scope)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        """``from torch.cuda import Event``: from ``cuda_api``, which has torch.cuda's others."""
        if (
            node.module == "torch"
            and node.level == 0
            and [name.name for name in node.names] == ["accelerator"]
        ):
            self.site(node, "accelerator")
            node.module = RUNTIME_PACKAGE if self.cuda_api else node.module
        if node.module == ANSWERED_SUBMODULE and node.level == 0:
            self.site(node, "cuda_api")
            node.module = self.cuda_api or node.module
        if node.module == "torch.cuda" and node.level == 0:
            answered = [name.name for name in node.names if name.name in NAMES]
            if answered:
                self.legacy_types |= any(name in LEGACY_TYPE_NAMES for name in answered)
                self.site(node, "cuda_api")
                node.module = self.cuda_api or node.module
        return node

    def device_module_lookup(self, node: ast.Call) -> None:
        """``getattr(torch, device.type)``: torch's module of a device named at run time, whose
        functions are then called through a variable nothing answers (transformers'
        ``caching_allocator_warmup``: ``if device.type in ["cuda", "xpu"]:`` then
        ``getattr(torch, device.type).mem_get_info``). In a function that also tests its device
        against CUDA's name, the test would open that door: the function keeps CUDA's meaning
        (see :meth:`finish`)."""
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in self.names.torch
            and not isinstance(node.args[1], ast.Constant)
        ):
            self.device_modules.setdefault(self.scope.function_key(), self.scope)

    def cuda_function_call(self, node: ast.Call) -> bool:
        """``torch.cuda.is_available()`` and the other routed functions, rerouted in place."""
        function = self._cuda_function(node.func)
        if function is None:
            return False
        self.site(node, "is_available" if function == "is_available" else "cuda_api")
        node.func = located(alias(function), node.func)
        return True

    def _cuda_function(self, func: ast.expr) -> Optional[str]:
        """``torch.cuda.<f>`` (or an imported alias of it) for a routed ``f``, else None."""
        if isinstance(func, ast.Name):
            return self.names.cuda_functions.get(func.id)
        if not isinstance(func, ast.Attribute) or func.attr not in CUDA_FUNCTIONS:
            return None
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id in self.names.cuda:
            return func.attr
        if (
            isinstance(owner, ast.Attribute)
            and owner.attr == "cuda"
            and isinstance(owner.value, ast.Name)
            and owner.value.id in self.names.torch
        ):
            return func.attr
        return None

    def note_type_call(self, node: ast.Call) -> None:
        """``x.type(T)``: a ``tensor_type`` site if the module names a legacy type anywhere
        (``T`` is often a variable), which is known once the whole module is walked."""
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "type"
            and self.is_object(func.value)
            and len(node.args) + len(node.keywords) >= 1
            and not any(isinstance(arg, ast.Starred) for arg in node.args)
        ):
            self.type_calls.append(node)

    def finish(self) -> None:
        super().finish()
        for key, scope in self.device_modules.items():
            if key in self.tested_functions:
                self.unanswered_use(DEVICE_MODULE, scope)
        if self.legacy_types:
            for call in self.type_calls:
                self._retype(call)

    def _retype(self, call: ast.Call) -> None:
        """``x.type(T)`` → ``__dmlpatch__.torch_cuda.retype(x, T)``, in place."""
        func = call.func
        assert isinstance(func, ast.Attribute)
        self.site(call, "tensor_type")
        call.args = [func.value, *call.args]
        routed = ast.Attribute(alias("torch_cuda"), "retype", ast.Load())
        call.func = located(routed, func)
