"""``torch.accelerator`` in rewritten code: torch >= 2.6's device-agnostic API, on DirectML.

torch-directml's torch 2.4.1 has no ``torch.accelerator``, and on later torch the simulated
device's backend answers only part of it (``synchronize`` and the memory functions fail). The
rewriter routes ``torch.accelerator`` (and ``from torch import accelerator``) here. Where the
program runs on DirectML every function answers for the target adapter, through the same
runtime as the program's CUDA sites, so ``torch.accelerator`` and ``torch.cuda`` code in one
program agree on the current device. Anywhere else each name is torch's own, missing where
torch lacks it, as under plain python.
"""

from __future__ import annotations

from typing import Any, Optional

from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import cuda_api as _cuda_api
from dmlpatch.runtime import cuda_device as _cuda_device

# Where the program is redirected to DirectML: the same test as torch.cuda's names.
from dmlpatch.runtime.cuda_target import target as _target


def _torch(name: str) -> Any:
    import torch

    return getattr(torch.accelerator, name)


def _device(device: Any) -> Optional[int]:
    """A ``torch.accelerator`` device argument (an index, or a device of the target's type) as
    the program's ordinal, which the runtime maps to an adapter."""
    if device is None or isinstance(device, int):
        return device
    target = _resolution.current()
    kind, _, index = str(device).partition(":")
    if kind != target.type:
        return _cuda_device.ordinal_of(device)
    if not index:
        return None
    if int(index) not in target.indices:
        raise RuntimeError(
            f"{device} is not one of the adapters dmlpatch maps ({target.describe_indices()})"
        )
    return target.indices.index(int(index))


def is_available() -> bool:
    if _target() is None:
        return bool(_torch("is_available")())
    return True


def current_accelerator(check_available: bool = False) -> Any:
    """The target device with its adapter: bare ``privateuseone`` would mean adapter 0."""
    if _target() is None:
        return _torch("current_accelerator")(check_available)
    import torch

    return torch.device(_cuda_device.device("cuda"))


def device_count() -> int:
    if _target() is None:
        return int(_torch("device_count")())
    return _cuda_device.device_count()


def current_device_index() -> int:
    if _target() is None:
        return int(_torch("current_device_index")())
    return _cuda_device.current_device()


def set_device_index(device: Any) -> None:
    if _target() is None:
        _torch("set_device_index")(device)
        return
    _cuda_device.set_device(_device(device))


current_device_idx = current_device_index
set_device_idx = set_device_index


def device_index(device: Any) -> Any:
    """``with torch.accelerator.device_index(i):`` as ``torch.cuda.device(i)``."""
    if _target() is None:
        return _torch("device_index")(device)
    return _cuda_api.device(_device(device))


def synchronize(device: Any = None) -> None:
    if _target() is None:
        _torch("synchronize")(device)
        return
    _cuda_device.synchronize(_device(device))


def current_stream(device: Any = None) -> Any:
    if _target() is None:
        return _torch("current_stream")(device)
    return _cuda_api.Stream(_device(device))


def empty_cache() -> None:
    if _target() is None:
        _torch("empty_cache")()


def _memory(name: str) -> Any:
    def function(device: Any = None) -> Any:
        if _target() is None:
            return _torch(name)(device)
        return getattr(_cuda_api, name)(_device(device))

    function.__name__ = function.__qualname__ = name
    return function


memory_allocated = _memory("memory_allocated")
max_memory_allocated = _memory("max_memory_allocated")
memory_reserved = _memory("memory_reserved")
max_memory_reserved = _memory("max_memory_reserved")
memory_stats = _memory("memory_stats")
reset_peak_memory_stats = _memory("reset_peak_memory_stats")
get_memory_info = _memory("mem_get_info")


def __getattr__(name: str) -> Any:
    """The rest of ``torch.accelerator`` (missing, as under plain python, on torch < 2.6)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _torch(name)
