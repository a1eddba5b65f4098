"""The FLOPs of one run of an ATen graph, estimated once from the shapes its nodes carry.

Compiled graphs run without module calls, so the layer hooks cannot count them; their forward
graphs are counted whole instead (:mod:`dmlpatch.patches.torch.compiler`). The formulas are
torch's own (``torch.utils.flop_counter``: matrix products, convolutions, attention), the
operators the layer families count in eager runs. Symbolic sizes count at their hint.
"""

from __future__ import annotations

from typing import Any


def estimate(graph: Any) -> int:
    """Sum over ``graph``'s nodes that torch has a FLOP formula for; 0 where it has none."""
    import torch
    from torch.fx import Node
    from torch.fx.node import map_aggregate
    from torch.utils.flop_counter import flop_registry

    def value(arg: Any) -> Any:
        if not isinstance(arg, Node):
            return arg
        if arg.op == "get_attr" and "val" not in arg.meta:  # a constant torch 2.4 kept unfaked
            return _attribute(graph, str(arg.target))
        return arg.meta.get("val")

    total = 0
    for node in graph.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        formula = flop_registry.get(target.overloadpacket)
        if formula is None:
            continue
        try:
            args = map_aggregate(node.args, value)
            kwargs = map_aggregate(node.kwargs, value)
            flops = formula(*args, **kwargs, out_val=node.meta.get("val"))
            total += _concrete(flops)
        except Exception:  # an estimate: a formula torch changed costs one node, not the run
            continue
    return total


def _attribute(graph: Any, dotted: str) -> Any:
    found = graph
    for part in dotted.split("."):
        found = getattr(found, part, None)
    return found


def _concrete(flops: Any) -> int:
    import torch

    if isinstance(flops, torch.SymInt):
        hint = flops.node.hint
        return int(hint) if hint is not None else 0
    return int(flops)
