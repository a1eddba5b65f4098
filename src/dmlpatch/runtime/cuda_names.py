"""Which ``torch.cuda`` names rewritten code gets answered by :mod:`dmlpatch.runtime.cuda_api`.

The rewriter reads these lists to decide what it routes (``torch.cuda.X`` → ``__dmlpatch__
.torch_cuda.X``); the runtime's modules answer them. Plain data, so that the rewriter learns the
names without loading the runtime's answers.
"""

from __future__ import annotations

#: torch.cuda's legacy tensor types and their dtypes.
LEGACY_TYPES = {
    "FloatTensor": "float32",
    "DoubleTensor": "float64",
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "ByteTensor": "uint8",
    "CharTensor": "int8",
    "ShortTensor": "int16",
    "IntTensor": "int32",
    "LongTensor": "int64",
    "BoolTensor": "bool",
}
LEGACY_TYPE_NAMES = frozenset(LEGACY_TYPES)

MEMORY_FUNCTIONS = (
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_accumulated_memory_stats",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "memory_snapshot",
    "mem_get_info",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
    "ipc_collect",
)

RNG_FUNCTIONS = (
    "get_rng_state",
    "get_rng_state_all",
    "set_rng_state",
    "set_rng_state_all",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "default_generators",
)

#: Names that raise a clear error on DirectML when used: CUDA graphs capture CUDA kernels to
#: replay them, and nothing on DirectML replays a capture.
ERRORS = frozenset({"CUDAGraph", "graph", "graph_pool_handle"})

#: The ``torch.cuda`` names answered here (those in :data:`ERRORS` with an error).
NAMES = frozenset(
    {
        "get_device_properties",
        "get_device_capability",
        "is_bf16_supported",
        "is_tf32_supported",
        "init",
        "can_device_access_peer",
        "device",
        "device_of",
        "Stream",
        "Event",
        "stream",
        "StreamContext",
        "set_stream",
        "current_stream",
        "default_stream",
        "is_current_stream_capturing",
        "make_graphed_callables",
        "nvtx",
        "random",
        *MEMORY_FUNCTIONS,
        *RNG_FUNCTIONS,
        *LEGACY_TYPES,
        *ERRORS,
    }
)
