"""``torch.cuda.<name>`` in rewritten code, for the CUDA API a program calls once it has a device.

The rewriter routes ``torch.cuda.X`` for each X in :data:`NAMES` to ``__dmlpatch__.torch_cuda.X``
(this module), and ``from torch.cuda import X`` to an import from here. On a usable CUDA GPU, and
where the program runs on the CPU, each name is torch.cuda's own, failing as it fails there. On
DirectML (or the simulated device) each answers for the adapter the program's ordinal maps to.

This module is the one name rewritten code and specs know; the answers live one job a module,
and are the same objects here (no call goes through one more function):

- ``cuda_names``: which names are answered (:data:`NAMES`, :data:`ERRORS`, the legacy types);
- ``cuda_target``: whether a call is on the DirectML target, and for which adapter;
- ``cuda_properties``: ``get_device_properties``, the capability questions, ``init``;
- ``cuda_memory``: the memory figures, ``mem_get_info``, the memory fraction;
- ``cuda_device_scope``: ``torch.cuda.device(i)`` and ``device_of``;
- ``cuda_random``: the random-number functions and ``torch.cuda.random``;
- ``cuda_streams``: ``Stream``, ``Event`` and the stream functions;
- ``cuda_graphs``: CUDA graphs (a clear error) and ``make_graphed_callables``;
- ``cuda_nvtx``: ``torch.cuda.nvtx``;
- ``cuda_legacy_types``: ``FloatTensor`` and its kin, ``retype`` for ``x.type(T)``.

Every other ``torch.cuda`` name is torch's own (:func:`__getattr__`). Nothing here imports torch
until a name is used.
"""

from __future__ import annotations

from typing import Any

from dmlpatch.runtime import cuda_random as _cuda_random
from dmlpatch.runtime.cuda_device_scope import device, device_of
from dmlpatch.runtime.cuda_graphs import (
    CUDAGraph,
    graph,
    graph_pool_handle,
    make_graphed_callables,
)
from dmlpatch.runtime.cuda_legacy_types import (
    BFloat16Tensor,
    BoolTensor,
    ByteTensor,
    CharTensor,
    DoubleTensor,
    FloatTensor,
    HalfTensor,
    IntTensor,
    LongTensor,
    ShortTensor,
    retype,
)
from dmlpatch.runtime.cuda_memory import (
    get_per_process_memory_fraction,
    ipc_collect,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from dmlpatch.runtime.cuda_names import ERRORS, LEGACY_TYPE_NAMES, NAMES
from dmlpatch.runtime.cuda_nvtx import nvtx
from dmlpatch.runtime.cuda_properties import (
    DeviceProperties,
    can_device_access_peer,
    get_device_capability,
    get_device_properties,
    init,
    is_bf16_supported,
    is_tf32_supported,
)
from dmlpatch.runtime.cuda_random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    random,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from dmlpatch.runtime.cuda_streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    is_current_stream_capturing,
    set_stream,
    stream,
)
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda

__all__ = [
    "ERRORS",
    "LEGACY_TYPE_NAMES",
    "NAMES",
    "BFloat16Tensor",
    "BoolTensor",
    "ByteTensor",
    "CUDAGraph",
    "CharTensor",
    "DeviceProperties",
    "DoubleTensor",
    "Event",
    "FloatTensor",
    "HalfTensor",
    "IntTensor",
    "LongTensor",
    "ShortTensor",
    "Stream",
    "StreamContext",
    "can_device_access_peer",
    "current_stream",
    "default_stream",
    "device",
    "device_of",
    "get_device_capability",
    "get_device_properties",
    "get_per_process_memory_fraction",
    "get_rng_state",
    "get_rng_state_all",
    "graph",
    "graph_pool_handle",
    "init",
    "initial_seed",
    "ipc_collect",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_tf32_supported",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "nvtx",
    "random",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "retype",
    "seed",
    "seed_all",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
]


def __getattr__(name: str) -> Any:
    """Other ``torch.cuda`` names, for ``from torch.cuda import Event, OutOfMemoryError``;
    ``default_generators``: the device's generator for each mapped adapter."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "default_generators" and _target() is not None:
        return _cuda_random.generators_per_adapter()
    return _cuda(name)
