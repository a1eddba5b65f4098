"""``torch.cuda.get_device_properties`` and the capability questions, for a DirectML adapter.

Its name and memory, compute capability 0.0 (no CUDA fast path applies: DirectML has no TF32,
bfloat16 or flash-attention kernels) and one multiprocessor (DirectML does not say how many it
has); peers read each other's memory only through the host.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dmlpatch import log
from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime.cuda_target import adapter as _adapter
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda


class DeviceProperties(NamedTuple):
    """What ``torch.cuda.get_device_properties`` returns, for a DirectML adapter."""

    name: str
    total_memory: int
    major: int = 0
    minor: int = 0
    multi_processor_count: int = 1
    is_integrated: int = 0
    is_multi_gpu_board: int = 0

    def __repr__(self) -> str:
        return (
            f"_DirectMLDeviceProperties(name='{self.name}', major={self.major}, "
            f"minor={self.minor}, total_memory={self.total_memory // 2**20}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device: Any = None) -> Any:
    target = _target()
    if target is None:
        return _cuda("get_device_properties")(device)
    index = _adapter(device)
    name = target.adapter_name(index)
    return DeviceProperties(name, _total_memory(target, name), is_integrated=int(_integrated(name)))


def get_device_capability(device: Any = None) -> tuple[int, int]:
    if _target() is None:
        return tuple(_cuda("get_device_capability")(device))
    properties = get_device_properties(device)
    return properties.major, properties.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: bfloat16 kernels abort DirectML (microsoft/DirectML#688)."""
    if _target() is None:
        return bool(_cuda("is_bf16_supported")())
    return False


def is_tf32_supported() -> bool:
    """False: DirectML has no TF32 kernels."""
    if _target() is None:
        return bool(_cuda("is_tf32_supported")())
    return False


def init() -> None:
    """Nothing to start: the device is already resolved."""
    if _target() is None:
        _cuda("init")()


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """False: a DirectML adapter reads another's memory only through the host."""
    if _target() is None:
        return bool(_cuda("can_device_access_peer")(device, peer_device))
    _adapter(device)
    _adapter(peer_device)
    return False


def _total_memory(target: _resolution.Resolution, name: str) -> int:
    from dmlpatch.devices import adapters

    size = adapters.total_memory(target.backend, name)
    if size is None:
        log.warn_once(
            f"memory:{name}",
            f"the memory size of {name} is unknown on this system (DirectML does not report "
            "it); torch.cuda.get_device_properties(...).total_memory reads 0",
        )
        return 0
    return size


def _integrated(name: str) -> bool:
    return "integrated" in name.lower() or any(
        word in name for word in ("UHD", "Iris", "Radeon(TM) Graphics", "Vega 8")
    )
