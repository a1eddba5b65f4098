"""Every device parameter of torch's public callables: generated, do not edit.

A device reaches torch through these parameters, positional or keyword
(``torch.Generator("cuda")``, ``torch.load(f, "cuda")``, ``x.to(dev)``,
``torch.randn(2, device=gpu)``); the rewriter meets a device at each of them
(``dmlpatch.rewriting.transform.device_sites``). Derived from the signatures of torch
2.4.1 and 2.14.1 by ``dmlpatch.rewriting.device_signatures`` and written by
``scripts/device_parameters.py``; ``tests/unit/test_device_parameters.py`` derives the
running torch's again and fails on any parameter missing here.

Each parameter is ``(name, position, kind)``: its position among the positional parameters
(``self`` not counted; None: keyword-only) in any of those torches, and what a value there is
(``device``, ``map_location``, ``device_type``, ``devices``, ``cuda_api``: see
``device_signatures.KINDS``). Methods of :data:`METHOD_CLASSES` are met by name whatever the
object (``METHODS``, the union over those classes); other callables by the name the program
imports them under (``FUNCTIONS``).
"""

from __future__ import annotations

from typing import Optional

#: One device parameter: its name, position (None: keyword-only) and kind.
Parameter = tuple[str, Optional[int], str]

TORCH_VERSIONS = ("2.4.1", "2.14.1")

METHOD_CLASSES = (
    "torch.Tensor",
    "torch.nn.Module",
    "torch.UntypedStorage",
    "torch.TypedStorage",
    "torch.nn.utils.rnn.PackedSequence",
)

CALLABLES: dict[str, tuple[Parameter, ...]] = {
    "torch.BoolStorage": (("device", None, "device"),),
    "torch.ByteStorage": (("device", None, "device"),),
    "torch.CharStorage": (("device", None, "device"),),
    "torch.DoubleStorage": (("device", None, "device"),),
    "torch.Event": (("device", 0, "device"),),
    "torch.FloatStorage": (("device", None, "device"),),
    "torch.Future": (("devices", 0, "devices"),),
    "torch.Generator": (("device", 0, "device"),),
    "torch.GradScaler": (("device", 0, "device"),),
    "torch.IntStorage": (("device", None, "device"),),
    "torch.LongStorage": (("device", None, "device"),),
    "torch.ShortStorage": (("device", None, "device"),),
    "torch.Stream": (
        ("device", 0, "device"),
        ("device_type", 2, "device_type"),
    ),
    "torch.Tensor": (("device", None, "device"),),
    "torch.Tensor.cuda": (("device", 0, "device"),),
    "torch.Tensor.is_pinned": (("device", 0, "device"),),
    "torch.Tensor.new": (("device", None, "device"),),
    "torch.Tensor.new_empty": (("device", None, "device"),),
    "torch.Tensor.new_empty_strided": (("device", None, "device"),),
    "torch.Tensor.new_full": (("device", None, "device"),),
    "torch.Tensor.new_ones": (("device", None, "device"),),
    "torch.Tensor.new_tensor": (("device", None, "device"),),
    "torch.Tensor.new_zeros": (("device", None, "device"),),
    "torch.Tensor.pin_memory": (("device", 0, "device"),),
    "torch.Tensor.to": (("device", 0, "device"),),
    "torch.Tensor.xpu": (("device", 0, "device"),),
    "torch.TypedStorage": (("device", None, "device"),),
    "torch.TypedStorage.cuda": (("device", 0, "device"),),
    "torch.TypedStorage.hpu": (("device", 0, "device"),),
    "torch.TypedStorage.is_pinned": (("device", 0, "device"),),
    "torch.TypedStorage.pin_memory": (("device", 0, "device"),),
    "torch.TypedStorage.to": (("device", None, "device"),),
    "torch.UntypedStorage.cuda": (("device", 0, "device"),),
    "torch.UntypedStorage.hpu": (("device", 0, "device"),),
    "torch.UntypedStorage.is_pinned": (("device", 0, "device"),),
    "torch.UntypedStorage.pin_memory": (("device", 0, "device"),),
    "torch.UntypedStorage.to": (("device", None, "device"),),
    "torch.accelerator.current_stream": (("device", 0, "cuda_api"),),
    "torch.accelerator.device_index": (("device", 0, "cuda_api"),),
    "torch.accelerator.get_device_capability": (("device", 0, "cuda_api"),),
    "torch.accelerator.get_memory_info": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.max_memory_allocated": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.max_memory_reserved": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.memory_allocated": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.memory_reserved": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.memory_stats": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.reset_accumulated_memory_stats": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.reset_peak_memory_stats": (("device_index", 0, "cuda_api"),),
    "torch.accelerator.set_device_idx": (("device", 0, "cuda_api"),),
    "torch.accelerator.set_device_index": (("device", 0, "cuda_api"),),
    "torch.accelerator.synchronize": (("device", 0, "cuda_api"),),
    "torch.amp.GradScaler": (("device", 0, "device"),),
    "torch.amp.autocast": (("device_type", 0, "device_type"),),
    "torch.amp.custom_bwd": (("device_type", None, "device_type"),),
    "torch.amp.custom_fwd": (("device_type", None, "device_type"),),
    "torch.amp.is_autocast_available": (("device_type", 0, "device_type"),),
    "torch.arange": (("device", None, "device"),),
    "torch.as_tensor": (("device", 2, "device"),),
    "torch.asarray": (("device", None, "device"),),
    "torch.autocast": (("device_type", 0, "device_type"),),
    "torch.autograd.graph.save_on_cpu": (("device_type", 1, "device_type"),),
    "torch.bartlett_window": (("device", None, "device"),),
    "torch.blackman_window": (("device", None, "device"),),
    "torch.cuda.BFloat16Storage": (("device", None, "cuda_api"),),
    "torch.cuda.BoolStorage": (("device", None, "cuda_api"),),
    "torch.cuda.ByteStorage": (("device", None, "cuda_api"),),
    "torch.cuda.CharStorage": (("device", None, "cuda_api"),),
    "torch.cuda.ComplexDoubleStorage": (("device", None, "cuda_api"),),
    "torch.cuda.ComplexFloatStorage": (("device", None, "cuda_api"),),
    "torch.cuda.DoubleStorage": (("device", None, "cuda_api"),),
    "torch.cuda.Event": (("device", 0, "cuda_api"),),
    "torch.cuda.FloatStorage": (("device", None, "cuda_api"),),
    "torch.cuda.HalfStorage": (("device", None, "cuda_api"),),
    "torch.cuda.IntStorage": (("device", None, "cuda_api"),),
    "torch.cuda.LongStorage": (("device", None, "cuda_api"),),
    "torch.cuda.ShortStorage": (("device", None, "cuda_api"),),
    "torch.cuda.Stream": (
        ("device", 0, "cuda_api"),
        ("device_type", 2, "cuda_api"),
    ),
    "torch.cuda.caching_allocator_alloc": (("device", 1, "cuda_api"),),
    "torch.cuda.can_device_access_peer": (
        ("device", 0, "cuda_api"),
        ("peer_device", 1, "cuda_api"),
    ),
    "torch.cuda.clock_rate": (("device", 0, "cuda_api"),),
    "torch.cuda.current_stream": (("device", 0, "cuda_api"),),
    "torch.cuda.default_stream": (("device", 0, "cuda_api"),),
    "torch.cuda.device": (("device", 0, "cuda_api"),),
    "torch.cuda.device_memory_used": (("device", 0, "cuda_api"),),
    "torch.cuda.get_device_capability": (("device", 0, "cuda_api"),),
    "torch.cuda.get_device_name": (("device", 0, "cuda_api"),),
    "torch.cuda.get_device_properties": (("device", 0, "cuda_api"),),
    "torch.cuda.get_per_process_memory_fraction": (("device", 0, "cuda_api"),),
    "torch.cuda.get_rng_state": (("device", 0, "cuda_api"),),
    "torch.cuda.get_stream_from_external": (("device", 1, "cuda_api"),),
    "torch.cuda.list_gpu_processes": (("device", 0, "cuda_api"),),
    "torch.cuda.max_memory_allocated": (("device", 0, "cuda_api"),),
    "torch.cuda.max_memory_cached": (("device", 0, "cuda_api"),),
    "torch.cuda.max_memory_reserved": (("device", 0, "cuda_api"),),
    "torch.cuda.mem_get_info": (("device", 0, "cuda_api"),),
    "torch.cuda.memory_allocated": (("device", 0, "cuda_api"),),
    "torch.cuda.memory_cached": (("device", 0, "cuda_api"),),
    "torch.cuda.memory_reserved": (("device", 0, "cuda_api"),),
    "torch.cuda.memory_stats": (("device", 0, "cuda_api"),),
    "torch.cuda.memory_stats_as_nested_dict": (("device", 0, "cuda_api"),),
    "torch.cuda.memory_summary": (("device", 0, "cuda_api"),),
    "torch.cuda.memory_usage": (("device", 0, "cuda_api"),),
    "torch.cuda.power_draw": (("device", 0, "cuda_api"),),
    "torch.cuda.reset_accumulated_memory_stats": (("device", 0, "cuda_api"),),
    "torch.cuda.reset_max_memory_allocated": (("device", 0, "cuda_api"),),
    "torch.cuda.reset_max_memory_cached": (("device", 0, "cuda_api"),),
    "torch.cuda.reset_peak_memory_stats": (("device", 0, "cuda_api"),),
    "torch.cuda.set_device": (("device", 0, "cuda_api"),),
    "torch.cuda.set_per_process_memory_fraction": (("device", 1, "cuda_api"),),
    "torch.cuda.set_rng_state": (("device", 1, "cuda_api"),),
    "torch.cuda.synchronize": (("device", 0, "cuda_api"),),
    "torch.cuda.temperature": (("device", 0, "cuda_api"),),
    "torch.cuda.use_mem_pool": (("device", 1, "cuda_api"),),
    "torch.cuda.utilization": (("device", 0, "cuda_api"),),
    "torch.device": (("device", 0, "device"),),
    "torch.distributed.DeviceMesh": (("device_type", 0, "device_type"),),
    "torch.distributed.barrier": (("device_ids", 2, "devices"),),
    "torch.distributed.broadcast_object_list": (("device", 3, "device"),),
    "torch.distributed.get_backend_impl": (("device", 1, "device"),),
    "torch.distributed.get_default_backend_for_device": (("device", 0, "device"),),
    "torch.distributed.init_device_mesh": (("device_type", 0, "device_type"),),
    "torch.distributed.init_process_group": (("device_id", 8, "device"),),
    "torch.distributed.new_group": (("device_id", 6, "device"),),
    "torch.distributed.recv_object_list": (("device", 3, "device"),),
    "torch.distributed.send_object_list": (("device", 3, "device"),),
    "torch.empty": (("device", None, "device"),),
    "torch.empty_like": (("device", None, "device"),),
    "torch.empty_permuted": (("device", None, "device"),),
    "torch.empty_quantized": (("device", None, "device"),),
    "torch.empty_strided": (("device", None, "device"),),
    "torch.eye": (("device", None, "device"),),
    "torch.from_file": (("device", None, "device"),),
    "torch.full": (("device", None, "device"),),
    "torch.full_like": (("device", None, "device"),),
    "torch.get_autocast_dtype": (("device_type", 0, "device_type"),),
    "torch.get_device_module": (("device", 0, "device"),),
    "torch.hamming_window": (("device", None, "device"),),
    "torch.hann_window": (("device", None, "device"),),
    "torch.hub.load_state_dict_from_url": (("map_location", 2, "map_location"),),
    "torch.import_ir_module": (("map_location", 2, "map_location"),),
    "torch.import_ir_module_from_buffer": (("map_location", 2, "map_location"),),
    "torch.is_autocast_enabled": (("device_type", 0, "device_type"),),
    "torch.jit.Future": (("devices", None, "devices"),),
    "torch.jit.load": (("map_location", 1, "map_location"),),
    "torch.kaiser_window": (("device", None, "device"),),
    "torch.linspace": (("device", None, "device"),),
    "torch.load": (("map_location", 1, "map_location"),),
    "torch.logspace": (("device", None, "device"),),
    "torch.nested.as_nested_tensor": (("device", 2, "device"),),
    "torch.nested.nested_tensor": (("device", None, "device"),),
    "torch.nn.AdaptiveLogSoftmaxWithLoss": (("device", 5, "device"),),
    "torch.nn.BatchNorm1d": (("device", 5, "device"),),
    "torch.nn.BatchNorm2d": (("device", 5, "device"),),
    "torch.nn.BatchNorm3d": (("device", 5, "device"),),
    "torch.nn.Bilinear": (("device", 4, "device"),),
    "torch.nn.Conv1d": (("device", 9, "device"),),
    "torch.nn.Conv2d": (("device", 9, "device"),),
    "torch.nn.Conv3d": (("device", 9, "device"),),
    "torch.nn.ConvTranspose1d": (("device", 10, "device"),),
    "torch.nn.ConvTranspose2d": (("device", 10, "device"),),
    "torch.nn.ConvTranspose3d": (("device", 10, "device"),),
    "torch.nn.DataParallel": (
        ("device_ids", 1, "devices"),
        ("output_device", 2, "device"),
    ),
    "torch.nn.Embedding": (("device", 9, "device"),),
    "torch.nn.EmbeddingBag": (("device", 10, "device"),),
    "torch.nn.GRU": (("device", 7, "device"),),
    "torch.nn.GRUCell": (("device", 3, "device"),),
    "torch.nn.GroupNorm": (("device", 4, "device"),),
    "torch.nn.InstanceNorm1d": (("device", 5, "device"),),
    "torch.nn.InstanceNorm2d": (("device", 5, "device"),),
    "torch.nn.InstanceNorm3d": (("device", 5, "device"),),
    "torch.nn.LSTM": (("device", 8, "device"),),
    "torch.nn.LSTMCell": (("device", 3, "device"),),
    "torch.nn.LayerNorm": (("device", 4, "device"),),
    "torch.nn.LazyBatchNorm1d": (("device", 4, "device"),),
    "torch.nn.LazyBatchNorm2d": (("device", 4, "device"),),
    "torch.nn.LazyBatchNorm3d": (("device", 4, "device"),),
    "torch.nn.LazyConv1d": (("device", 8, "device"),),
    "torch.nn.LazyConv2d": (("device", 8, "device"),),
    "torch.nn.LazyConv3d": (("device", 8, "device"),),
    "torch.nn.LazyConvTranspose1d": (("device", 9, "device"),),
    "torch.nn.LazyConvTranspose2d": (("device", 9, "device"),),
    "torch.nn.LazyConvTranspose3d": (("device", 9, "device"),),
    "torch.nn.LazyInstanceNorm1d": (("device", 4, "device"),),
    "torch.nn.LazyInstanceNorm2d": (("device", 4, "device"),),
    "torch.nn.LazyInstanceNorm3d": (("device", 4, "device"),),
    "torch.nn.LazyLinear": (("device", 2, "device"),),
    "torch.nn.Linear": (("device", 3, "device"),),
    "torch.nn.LinearCrossEntropyLoss": (("device", None, "device"),),
    "torch.nn.Module.cuda": (("device", 0, "device"),),
    "torch.nn.Module.ipu": (("device", 0, "device"),),
    "torch.nn.Module.mtia": (("device", 0, "device"),),
    "torch.nn.Module.to": (("device", 0, "device"),),
    "torch.nn.Module.to_empty": (("device", None, "device"),),
    "torch.nn.Module.xpu": (("device", 0, "device"),),
    "torch.nn.MultiheadAttention": (("device", 9, "device"),),
    "torch.nn.PReLU": (("device", 2, "device"),),
    "torch.nn.RMSNorm": (("device", 3, "device"),),
    "torch.nn.RNN": (("device", 8, "device"),),
    "torch.nn.RNNBase": (("device", 9, "device"),),
    "torch.nn.RNNCell": (("device", 4, "device"),),
    "torch.nn.RNNCellBase": (("device", 4, "device"),),
    "torch.nn.SyncBatchNorm": (("device", 6, "device"),),
    "torch.nn.Transformer": (("device", 13, "device"),),
    "torch.nn.TransformerDecoderLayer": (("device", 9, "device"),),
    "torch.nn.TransformerEncoderLayer": (("device", 9, "device"),),
    "torch.normal": (("device", None, "device"),),
    "torch.ones": (("device", None, "device"),),
    "torch.ones_like": (("device", None, "device"),),
    "torch.rand": (("device", None, "device"),),
    "torch.rand_like": (("device", None, "device"),),
    "torch.randint": (("device", None, "device"),),
    "torch.randint_like": (("device", None, "device"),),
    "torch.randn": (("device", None, "device"),),
    "torch.randn_like": (("device", None, "device"),),
    "torch.random.fork_rng": (
        ("device_type", 4, "device_type"),
        ("devices", 0, "devices"),
    ),
    "torch.randperm": (("device", None, "device"),),
    "torch.range": (("device", None, "device"),),
    "torch.scalar_tensor": (("device", None, "device"),),
    "torch.serialization.load": (("map_location", 1, "map_location"),),
    "torch.set_autocast_dtype": (("device_type", 0, "device_type"),),
    "torch.set_autocast_enabled": (("device_type", 0, "device_type"),),
    "torch.set_default_device": (("device", 0, "device"),),
    "torch.sparse_bsc_tensor": (("device", None, "device"),),
    "torch.sparse_bsr_tensor": (("device", None, "device"),),
    "torch.sparse_compressed_tensor": (("device", None, "device"),),
    "torch.sparse_coo_tensor": (("device", None, "device"),),
    "torch.sparse_csc_tensor": (("device", None, "device"),),
    "torch.sparse_csr_tensor": (("device", None, "device"),),
    "torch.tensor": (("device", None, "device"),),
    "torch.testing.make_tensor": (("device", None, "device"),),
    "torch.tril_indices": (("device", None, "device"),),
    "torch.triu_indices": (("device", None, "device"),),
    "torch.utils.checkpoint.set_device_states": (
        ("device_type", None, "device_type"),
        ("devices", 0, "devices"),
    ),
    "torch.utils.data.DataLoader": (("pin_memory_device", None, "pin_memory_device"),),
    "torch.zeros": (("device", None, "device"),),
    "torch.zeros_like": (("device", None, "device"),),
}


def _split() -> tuple[dict[str, tuple[Parameter, ...]], dict[str, tuple[Parameter, ...]]]:
    """The callables met by qualified name, and the methods met by name (merged over classes:
    positional where any class takes the parameter so)."""
    functions: dict[str, tuple[Parameter, ...]] = {}
    methods: dict[str, dict[str, Parameter]] = {}
    for qualified, parameters in CALLABLES.items():
        owner, _, name = qualified.rpartition(".")
        if owner in METHOD_CLASSES:
            merged = methods.setdefault(name, {})
            for parameter in parameters:
                known = merged.get(parameter[0])
                if known is None or known[1] is None:
                    merged[parameter[0]] = parameter
        else:
            functions[qualified] = parameters
    return functions, {name: tuple(found.values()) for name, found in methods.items()}


FUNCTIONS, METHODS = _split()
#: The modules those callables live in (``torch.nn``, ``torch.utils.data``...), which a program
#: may import under a name of its own.
MODULES = frozenset(
    name.rsplit(".", depth)[0] for name in FUNCTIONS for depth in range(1, name.count("."))
)
