"""Whether a ``torch.cuda`` name is answered for a DirectML adapter, and for which adapter.

Every answer of :mod:`dmlpatch.runtime.cuda_api` starts here: off the DirectML target (a CUDA
GPU, or the CPU) it is torch.cuda's own name, failing as it fails there; on it, the program's
device argument names one adapter. :class:`TorchsOffTarget` is the same test for the classes
that stand for torch.cuda's.
"""

from __future__ import annotations

from typing import Any, Optional

from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import cuda_device as _cuda_device


def target() -> Optional[_resolution.Resolution]:
    """The resolution when programs are redirected to an accelerator; None where torch.cuda's
    own answer is the right one (a CUDA GPU, or the CPU, where it fails as it would anyway)."""
    resolution = _resolution.current()
    if resolution.patches_needed and resolution.is_accelerator:
        return resolution
    return None


def torch_cuda(name: str) -> Any:
    """torch.cuda's own ``name``, for where its answer is the right one."""
    import torch

    return getattr(torch.cuda, name)


def adapter(device: Any) -> int:
    """The adapter index behind a program's device argument (an ordinal, ``'cuda:1'``, a
    ``torch.device``, or the target's own ``privateuseone:N``)."""
    resolution = _resolution.current()
    if getattr(device, "type", None) == resolution.type and device.index is not None:
        return int(device.index)
    if isinstance(device, str) and device.startswith(f"{resolution.type}:"):
        return int(device.partition(":")[2])
    return _cuda_device.target_index(_cuda_device.ordinal_of(device))


class TorchsOffTarget(type):
    """A class standing for torch.cuda's class of the same name: called, it is torch's off the
    DirectML target and ``on_target(...)`` on it; ``isinstance`` asks torch's class too. A class,
    not a function, so annotations (``torch.cuda.CUDAGraph | None``), ``isinstance`` and
    subclassing work wherever the name is used."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if target() is None:
            return torch_cuda(cls.__name__)(*args, **kwargs)
        return cls.on_target(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        if type.__instancecheck__(cls, instance):
            return True
        own = torch_cuda(cls.__name__)
        return isinstance(own, type) and isinstance(instance, own)

    def on_target(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError
