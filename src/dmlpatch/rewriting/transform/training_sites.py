"""``amp`` and ``inference_mode`` sites: autocast, GradScaler, ``torch.cuda.amp``'s decorators
for custom autograd functions and inference mode, which DirectML runs its own way
(``dmlpatch.runtime.amp``, ``dmlpatch.runtime.inference``)."""

from __future__ import annotations

import ast
from typing import Optional

from dmlpatch.rewriting.transform.names import AMP, CUSTOM_AMP
from dmlpatch.rewriting.transform.nodes import alias, dotted, located
from dmlpatch.rewriting.transform.walker import Walker


class TrainingSites(Walker):
    def amp_call(self, node: ast.Call) -> bool:
        """A call of autocast or GradScaler, rerouted in place; False for any other call."""
        func = node.func
        amp = self._amp_callee(func)
        if amp is None:
            return False
        self.site(node, "amp")
        node.args = [func, *node.args]
        node.func = located(alias(amp), func)
        return True

    def _amp_callee(self, func: ast.expr) -> Optional[str]:
        """The runtime function for a call of autocast or GradScaler, else None."""
        if isinstance(func, ast.Name):
            return self.names.amp_callees.get(func.id)
        if not isinstance(func, ast.Attribute) or func.attr not in AMP:
            return None
        owner = func.value
        if isinstance(owner, ast.Name):
            is_amp = owner.id in self.names.amp_modules or owner.id in self.names.torch
        else:
            is_amp = dotted(owner, self.names.torch) in ("amp", "cuda.amp") or (
                isinstance(owner, ast.Attribute)
                and owner.attr == "amp"
                and isinstance(owner.value, ast.Name)
                and owner.value.id in self.names.cuda
            )
        return AMP[func.attr] if is_amp else None

    def is_custom_amp(self, node: ast.expr) -> bool:
        """``torch.cuda.amp.custom_fwd`` / ``custom_bwd`` read, under any name a module binds."""
        if isinstance(node, ast.Name):
            return node.id in self.names.custom_amp and isinstance(node.ctx, ast.Load)
        if not (
            isinstance(node, ast.Attribute)
            and node.attr in CUSTOM_AMP
            and isinstance(node.ctx, ast.Load)
        ):
            return False
        owner = node.value
        if isinstance(owner, ast.Name):
            return owner.id in self.names.cuda_amp_modules
        return dotted(owner, self.names.torch) == "cuda.amp" or (
            isinstance(owner, ast.Attribute)
            and owner.attr == "amp"
            and isinstance(owner.value, ast.Name)
            and owner.value.id in self.names.cuda
        )

    def custom_amp(self, node: ast.expr) -> ast.expr:
        """``custom_fwd`` → ``__dmlpatch__.custom_amp(custom_fwd)``, called or not."""
        self.site(node, "amp")
        return located(ast.Call(alias("custom_amp"), [node], []), node)

    def inference_mode_name(self, func: ast.expr) -> bool:
        """``inference_mode`` as imported from torch."""
        return isinstance(func, ast.Name) and func.id in self.names.inference_mode

    def inference_mode(self, node: ast.expr) -> ast.expr:
        self.site(node, "inference_mode")
        return located(alias("inference_mode"), node)

    def decorators(self, decorators: list[ast.expr]) -> None:
        """``@inference_mode`` imported from torch and ``@custom_fwd`` from torch.cuda.amp,
        bare (a call is found as a call, an attribute as an attribute)."""
        for index, decorator in enumerate(decorators):
            if self.inference_mode_name(decorator):
                decorators[index] = self.inference_mode(decorator)
            elif isinstance(decorator, ast.Name) and self.is_custom_amp(decorator):
                decorators[index] = self.custom_amp(decorator)

    def is_torch_inference_mode(self, node: ast.Attribute) -> bool:
        """``torch.inference_mode``, read."""
        owner = node.value
        return (
            node.attr == "inference_mode"
            and isinstance(owner, ast.Name)
            and owner.id in self.names.torch
            and isinstance(node.ctx, ast.Load)
        )
