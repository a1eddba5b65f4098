"""The rewriter: every site kind on one walk, in the order a call is tried against them."""

from __future__ import annotations

import ast

from dmlpatch.rewriting.transform.as_written import KeptAsWritten
from dmlpatch.rewriting.transform.complex_sites import ComplexSites
from dmlpatch.rewriting.transform.cuda_api_sites import CudaApiSites
from dmlpatch.rewriting.transform.device_sites import DeviceSites
from dmlpatch.rewriting.transform.device_tests import DeviceTestSites
from dmlpatch.rewriting.transform.training_sites import TrainingSites


class Transformer(
    DeviceSites, DeviceTestSites, CudaApiSites, TrainingSites, ComplexSites, KeptAsWritten
):
    def visit_Call(self, node: ast.Call) -> ast.expr:
        if self.inference_mode_name(node.func):
            node.func = self.inference_mode(node.func)
            return node
        if self.amp_call(node):
            return node
        if isinstance(node.func, ast.Name) and self.is_custom_amp(node.func):
            node.func = self.custom_amp(node.func)
            return node
        self.note_type_call(node)
        self.device_module_lookup(node)
        if self.load_call(node) or self.cuda_function_call(node) or self.queue_call(node):
            return node
        call = self.cuda_method_call(node)
        if call is not None:
            return call
        if self.prefix_test(node) or self.lookup(node):
            return node
        self.device_arguments(node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        if self.is_torch_inference_mode(node):
            return self.inference_mode(node)
        if self.is_custom_amp(node):
            return self.custom_amp(node)
        tested = self.is_cuda_attribute(node)
        if tested is not None:
            return tested
        return self.cuda_attribute(node)

    def visit_If(self, node: ast.If) -> ast.AST:
        self.cuda_layout_branch(node)
        return DeviceSites.visit_If(self, node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.defaults(node.args)
        self.decorators(node.decorator_list)
        self.returns(node)
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.defaults(node.args)
        self.decorators(node.decorator_list)
        self.returns(node)
        return node

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self.defaults(node.args)
        return node
