"""The parts of dmlpatch's torch.compile support that need no device: which graphs are sent
past Inductor, the FLOPs a compiled graph counts, and the global-hook question torch asks
before each call of a compiled module."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from dmlpatch.patches.torch import compiler
from dmlpatch.placement import graph_flops, ledger, module_hooks


def test_graphs_off_directml_go_to_inductor_untouched() -> None:
    graph = torch.fx.symbolic_trace(nn.Linear(4, 2))
    inputs = [torch.randn(3, 4)]
    calls: list[tuple[Any, ...]] = []

    def inductor(*args: Any, **kwargs: Any) -> str:
        calls.append((args, kwargs))
        return "inductor's"

    options = {"config_patches": {"triton.cudagraphs": True}}
    assert compiler.compile_fx(inductor, None, (graph, inputs), options) == "inductor's"
    assert calls == [((graph, inputs), options)]


def test_reduce_overhead_is_recognised_in_both_spellings() -> None:
    assert compiler._asks_for_cuda_graphs({"triton.cudagraphs": True})
    assert compiler._asks_for_cuda_graphs({"triton": {"cudagraphs": True}})
    assert not compiler._asks_for_cuda_graphs({"max_autotune": True})
    assert not compiler._asks_for_cuda_graphs(None)


def test_a_graph_counts_the_flops_of_its_matrix_products_and_convolutions() -> None:
    layers = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    graph = make_fx(layers)(torch.randn(2, 3, 8, 8))
    convolution = 2 * 2 * 4 * 6 * 6 * 3 * 9
    linear = 2 * 2 * (4 * 6 * 6) * 5
    assert graph_flops.estimate(graph) == convolution + linear


def test_compiling_a_model_counts_no_layer_call() -> None:
    # Torch 2.4's Dynamo runs each layer three times on fake tensors to trace one graph: an
    # ordinary run of a compiled model counted 2.5 times its compute there, 1.0 on torch 2.14.
    layers = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    book = module_hooks.install()
    try:
        torch.compile(layers, backend="aot_eager")(torch.randn(2, 3, 8, 8))
        compiled = book.totals(ledger.CPU)
        layers(torch.randn(2, 3, 8, 8))
        eager = book.totals(ledger.CPU)
    finally:
        module_hooks.uninstall()
        ledger.stop()
        torch._dynamo.reset()
    assert compiled == (0, 0)
    # A linear layer counts its bias among its weights (families.layer_flops).
    assert eager == (2, 2 * 2 * 4 * 6 * 6 * 3 * 9 + 2 * 2 * (4 * 6 * 6 * 5 + 5))


def test_a_graph_without_heavy_operators_counts_nothing() -> None:
    graph = make_fx(lambda x: (x + 1).relu())(torch.randn(3))
    assert graph_flops.estimate(graph) == 0


def test_only_other_global_hooks_make_compiled_modules_warn() -> None:
    module_hooks.install()
    try:
        assert module_hooks._has_any_global_hook_but_ours() is False
        handle = nn.modules.module.register_module_forward_pre_hook(lambda *args: None)
        try:
            assert module_hooks._has_any_global_hook_but_ours() is True
        finally:
            handle.remove()
        if module_hooks._ANY_GLOBAL_HOOK is not None:  # torch >= 2.5 asks this question
            asked = nn.modules.module._has_any_global_hook
            assert asked is module_hooks._has_any_global_hook_but_ours
    finally:
        module_hooks.uninstall()
        ledger.stop()
    if module_hooks._ANY_GLOBAL_HOOK is not None:
        assert nn.modules.module._has_any_global_hook is module_hooks._ANY_GLOBAL_HOOK
