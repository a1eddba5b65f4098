"""``torch.cuda.FloatTensor`` and the other legacy tensor types on DirectML.

Built on the device; ``isinstance`` checks dtype and device; ``x.type(torch.cuda.FloatTensor)``
moves ``x`` (:func:`retype`).
"""

from __future__ import annotations

import re
from typing import Any

from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import cuda_device as _cuda_device
from dmlpatch.runtime.cuda_names import LEGACY_TYPES as _LEGACY_TYPES
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda

_LEGACY_TYPE_TEXT = re.compile(r"torch\.cuda\.(\w+Tensor)")


class _LegacyType(type):
    """``torch.cuda.FloatTensor`` and its kin: build on the device, recognise device tensors."""

    dtype_name: str

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if _target() is None:
            return _cuda(cls.__name__)(*args, **kwargs)
        import torch

        built = getattr(torch, cls.__name__)(*args, **kwargs)
        return built.to(_cuda_device.device("cuda"))

    def __instancecheck__(cls, instance: Any) -> bool:
        if _target() is None:
            return isinstance(instance, _cuda(cls.__name__))
        import torch

        return (
            isinstance(instance, torch.Tensor)
            and instance.device.type == _resolution.current().type
            and instance.dtype == getattr(torch, cls.dtype_name)
        )

    @property
    def dtype(cls) -> Any:
        import torch

        return getattr(torch, cls.dtype_name)

    @property
    def is_cuda(cls) -> bool:
        return True


def _legacy_type(name: str) -> _LegacyType:
    return _LegacyType(name, (), {"dtype_name": _LEGACY_TYPES[name], "__module__": __name__})


FloatTensor = _legacy_type("FloatTensor")
DoubleTensor = _legacy_type("DoubleTensor")
HalfTensor = _legacy_type("HalfTensor")
BFloat16Tensor = _legacy_type("BFloat16Tensor")
ByteTensor = _legacy_type("ByteTensor")
CharTensor = _legacy_type("CharTensor")
ShortTensor = _legacy_type("ShortTensor")
IntTensor = _legacy_type("IntTensor")
LongTensor = _legacy_type("LongTensor")
BoolTensor = _legacy_type("BoolTensor")


def retype(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.type(T)`` in a module that names torch.cuda's legacy types: to the device when T is
    one (the class or its ``'torch.cuda.FloatTensor'`` name), else ``obj.type`` as written."""
    wanted = args[0] if args else kwargs.get("dtype")
    if isinstance(wanted, str):
        match = _LEGACY_TYPE_TEXT.fullmatch(wanted)
        if match is not None and match.group(1) in _LEGACY_TYPES:
            wanted = globals()[match.group(1)]
    if isinstance(wanted, _LegacyType) and _target() is not None:
        import torch

        return obj.to(
            device=_cuda_device.device("cuda"),
            dtype=getattr(torch, wanted.dtype_name),
            non_blocking=bool(kwargs.get("non_blocking", False)),
        )
    if isinstance(wanted, _LegacyType):
        args = (_cuda(wanted.__name__), *args[1:])
        kwargs.pop("dtype", None)
    return obj.type(*args, **kwargs)
