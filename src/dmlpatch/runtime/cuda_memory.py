"""``torch.cuda``'s memory figures for a DirectML adapter.

What the adapter's allocator holds now and its peak since the last reset
(:mod:`dmlpatch.runtime.memory_peaks`: the allocator's own on the simulated device; on DirectML
what torch-directml's ``gpu_memory`` reports, the peak being the highest it reported at each
memory query and optimizer step); ``mem_get_info`` is free and total memory where the adapter's
size is known (Windows), else CUDA's error. No cache is counted apart from what the allocator
holds, so "reserved" is "allocated".
"""

from __future__ import annotations

from typing import Any, Callable

from dmlpatch import log
from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime.cuda_target import adapter as _adapter
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda


def _in_use(device: Any) -> int:
    from dmlpatch.runtime import memory_peaks

    return memory_peaks.in_use(_resolution.current().backend, _adapter(device))


def _memory_function(name: str, answer: Callable[[Any], Any]) -> Callable[..., Any]:
    def function(device: Any = None) -> Any:
        if _target() is None:
            return _cuda(name)(device)
        return answer(device)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"``torch.cuda.{name}`` for the DirectML adapter ``device`` maps to."
    return function


def _peak(device: Any) -> int:
    from dmlpatch.runtime import memory_peaks

    return memory_peaks.peak(_resolution.current().backend, _adapter(device))


def _reset_peak(device: Any) -> None:
    from dmlpatch.runtime import memory_peaks

    memory_peaks.reset_peak(_resolution.current().backend, _adapter(device))


def _stats(device: Any) -> dict[str, int]:
    current, peak = _in_use(device), _peak(device)
    stats: dict[str, int] = {}
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[f"{kind}.all.current"] = current
        stats[f"{kind}.all.peak"] = peak
    return stats


def _summary(device: Any = None, abbreviated: bool = False) -> str:
    current, peak = _in_use(device), _peak(device)
    name = _resolution.current().adapter_name(_adapter(device))
    return (
        f"DirectML memory of {name}: {current / 2**20:.1f} MiB in use, "
        f"{peak / 2**20:.1f} MiB peak (the adapter's allocator; no per-pool statistics)"
    )


def _free_and_total(device: Any) -> tuple[int, int]:
    target = _resolution.current()
    name = target.adapter_name(_adapter(device))
    from dmlpatch.devices import adapters

    total = adapters.total_memory(target.backend, name)
    if total is None:
        raise RuntimeError(
            f"torch.cuda.mem_get_info: the memory size of {name} is unknown on this system "
            "(DirectML does not report it)"
        )
    return max(total - _in_use(device), 0), total


def _nested_stats(device: Any) -> dict[str, Any]:
    """``memory_stats_as_nested_dict``: the flat statistics' dotted keys as nested dicts."""
    nested: dict[str, Any] = {}
    for key, value in _stats(device).items():
        *path, last = key.split(".")
        level = nested
        for part in path:
            level = level.setdefault(part, {})
        level[last] = value
    return nested


memory_allocated = _memory_function("memory_allocated", _in_use)
memory_reserved = _memory_function("memory_reserved", _in_use)
memory_cached = _memory_function("memory_cached", _in_use)
max_memory_allocated = _memory_function("max_memory_allocated", _peak)
max_memory_reserved = _memory_function("max_memory_reserved", _peak)
max_memory_cached = _memory_function("max_memory_cached", _peak)
reset_peak_memory_stats = _memory_function("reset_peak_memory_stats", _reset_peak)
reset_max_memory_allocated = _memory_function("reset_max_memory_allocated", _reset_peak)
reset_max_memory_cached = _memory_function("reset_max_memory_cached", _reset_peak)
reset_accumulated_memory_stats = _memory_function(
    "reset_accumulated_memory_stats", lambda device: _reset_peak(device)
)
memory_stats = _memory_function("memory_stats", _stats)
memory_stats_as_nested_dict = _memory_function("memory_stats_as_nested_dict", _nested_stats)
mem_get_info = _memory_function("mem_get_info", _free_and_total)
get_per_process_memory_fraction = _memory_function(
    "get_per_process_memory_fraction", lambda device: 1.0
)


def memory_snapshot(*args: Any, **kwargs: Any) -> list[Any]:
    """No segments: torch-directml's allocator does not list them."""
    if _target() is None:
        return list(_cuda("memory_snapshot")(*args, **kwargs))
    return []


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    if _target() is None:
        return str(_cuda("memory_summary")(device, abbreviated))
    return _summary(device, abbreviated)


def ipc_collect() -> None:
    """Nothing to collect: DirectML tensors are not shared between processes."""
    if _target() is None:
        _cuda("ipc_collect")()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    if _target() is None:
        _cuda("set_per_process_memory_fraction")(fraction, device)
        return
    log.warn_once(
        "memory_fraction",
        "torch.cuda.set_per_process_memory_fraction has no DirectML counterpart; "
        "the program's memory is not capped",
    )
