"""torch.compile on DirectML: graphs on the device go through AOTAutograd, not Inductor.

torch has no compiler for DirectML: Inductor generates Triton kernels for CUDA and C++ for the
CPU, and a graph whose tensors are on ``privateuseone`` stops with ``no scheduling registered
for device privateuseone`` (or ``KeyError: 'privateuseone'``, by torch version). Inductor's
entry point is wrapped; a graph with a DirectML tensor among its inputs or its values is traced
by Dynamo and AOTAutograd as Inductor would have it (graph breaks, guards, the forward and
backward graphs) and its ATen operators then run on the device one by one, which is torch's own
``aot_eager`` backend: the same results, none of the fusion. Said once.

``mode="reduce-overhead"`` records CUDA graphs, which DirectML has not: such graphs run without
them, said once. Graphs on the CPU or on a CUDA GPU go to Inductor as without dmlpatch.

While compiled graphs run, the placement accounting counts them here: module hooks do not fire
inside a graph (:mod:`dmlpatch.placement.module_hooks` steps aside while Dynamo traces), so each
run of a forward graph adds the FLOPs of its matrix products, convolutions and attention,
estimated once from the graph's shapes.
"""

from __future__ import annotations

from typing import Any, Callable

from dmlpatch import log

DEVICE_TYPE = "privateuseone"

Wrapper = Callable[..., Any]


def compile_fx(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Inductor's ``compile_fx(model_, example_inputs_, ...)``: device graphs run as aot_eager."""
    graph = args[0] if args else kwargs.get("model_")
    inputs = args[1] if len(args) > 1 else kwargs.get("example_inputs_", ())
    if not _on_directml(graph, inputs):
        return wrapped(*args, **kwargs)
    log.say_once(
        "torch.compile",
        "torch.compile: torch has no compiler for DirectML; graphs on the device run "
        "operator by operator through AOTAutograd (torch's aot_eager backend): eager's "
        "results, without fused kernels",
    )
    patches = kwargs.get("config_patches") or (args[3] if len(args) > 3 else None) or {}
    if _asks_for_cuda_graphs(patches):
        log.say_once(
            "torch.compile:cudagraphs",
            "torch.compile: mode='reduce-overhead' records CUDA graphs, which DirectML has "
            "not; its graphs run without them",
        )
    return _aot_on_device(graph, inputs)


def _on_directml(graph: Any, inputs: Any) -> bool:
    import torch

    for value in inputs or ():
        if isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE:
            return True
    for node in getattr(getattr(graph, "graph", None), "nodes", ()):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE:
            return True
    return False


def _asks_for_cuda_graphs(patches: Any) -> bool:
    if not isinstance(patches, dict):
        return False
    return bool(patches.get("triton.cudagraphs")) or bool(
        (patches.get("triton") or {}).get("cudagraphs")
        if isinstance(patches.get("triton"), dict)
        else False
    )


def _aot_on_device(graph: Any, inputs: Any) -> Any:
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    backend = aot_autograd(
        fw_compiler=_counted(boxed_nop),
        bw_compiler=boxed_nop,
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )
    return backend(graph, inputs)


def _counted(compiler: Wrapper) -> Wrapper:
    """A forward compiler whose graph adds its FLOPs to the placement ledger on each run."""

    def compile_forward(graph: Any, inputs: Any) -> Any:
        run = compiler(graph, inputs)
        from dmlpatch.placement import graph_flops, ledger

        if ledger.current() is None:
            return run
        flops = graph_flops.estimate(graph)

        def counted(args: Any) -> Any:
            book = ledger.current()
            if book is not None:
                book.add(DEVICE_TYPE, flops)
            return run(args)

        counted.__dict__["_boxed_call"] = True  # called with one list, as boxed_nop's run
        return counted

    return compile_forward
