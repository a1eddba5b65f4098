"""``with torch.cuda.device(i):`` and ``torch.cuda.device_of(tensor)`` on DirectML: ordinal i
current inside, as with ``set_device``."""

from __future__ import annotations

from typing import Any, Optional

from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import cuda_device as _cuda_device
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda


class device:
    """``with torch.cuda.device(i):`` makes ordinal i current, then restores the previous one."""

    def __new__(cls, device: Any) -> Any:
        if _target() is None:
            return _cuda("device")(device)
        return super().__new__(cls)

    def __init__(self, device: Any) -> None:
        self.ordinal = _cuda_device.ordinal_of(device)
        self.previous: Optional[int] = None

    def __enter__(self) -> None:
        self.previous = _cuda_device.current_device()
        if self.ordinal is not None and self.ordinal >= 0:
            _cuda_device.set_device(self.ordinal)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            _cuda_device.set_device(self.previous)


def device_of(obj: Any) -> Any:
    """``with torch.cuda.device_of(tensor):``: the ordinal of the adapter ``tensor`` is on is
    current inside; a tensor elsewhere changes nothing, as on CUDA."""
    if _target() is None:
        return _cuda("device_of")(obj)
    target = _resolution.current()
    on: Any = getattr(obj, "device", None)
    ordinal = -1
    if getattr(on, "type", None) == target.type and on.index in target.indices:
        ordinal = target.indices.index(on.index)
    return device(ordinal)
