"""What a rewritten module's *tests* of its device see: the target as CUDA.

Code that chose CUDA goes on asking whether it got it: ``if x.device.type == "cuda":``,
``str(device).startswith("cuda")``, ``if args.device == "cuda": model.cuda()``,
``device.type in ("cuda", "xpu")``, ``match device.type: case "cuda":``,
``AUTOCAST_DTYPES[device.type]``, ``x.is_cuda``. Once dmlpatch has given it the adapter for
``"cuda"``, each of these said no, and the program took its CPU branch with its model on the
device (or left it on the CPU, silently). The rewriter (``dmlpatch.rewriting.transform``)
wraps the compared value, and only inside the test, in :func:`as_cuda`, so the answer is the one
CUDA would give while the value itself goes nowhere else: the program's device stays
``privateuseone:0`` everywhere it is used.

:func:`as_cuda` names the target device as the program's CUDA device it stands for: the
target's type is ``"cuda"``, adapter ``privateuseone:N`` is ``cuda:k`` for the program's ordinal
``k`` that maps to it, a ``torch.device`` likewise, and a list, tuple or set of them item by
item. Everything else is returned as it is, and everything is returned as it is where the
process runs on a CUDA GPU or on the CPU.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from dmlpatch.devices import resolution as _resolution


class CudaSpelled(str):
    """The target's name for a CUDA literal (``"privateuseone:0"`` for ``"cuda"``) that remembers
    how the program spelled it, so that a later ``args.device == "cuda"`` finds what it wrote.
    Everywhere else it is the plain string; pickled (a checkpoint's config), it is one."""

    cuda: str

    def __new__(cls, target: str, cuda: str) -> CudaSpelled:
        spelled = super().__new__(cls, target)
        spelled.cuda = cuda
        return spelled

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (str(self),))


#: The resolution last seen, and the device type CUDA's name stands for under it (None: none).
_seen: Any = None
_seen_type: Optional[str] = None
#: Strings and torch.device values tested under the resolution seen, and what they are as CUDA.
_answers: dict[Any, Any] = {}


def _target_type() -> Optional[str]:
    """The type of the accelerator dmlpatch gave for ``"cuda"`` (``privateuseone``); None where
    the process runs on a CUDA GPU or on the CPU."""
    global _seen, _seen_type
    resolution = _resolution.current()
    if resolution is not _seen:
        accelerated = resolution.patches_needed and resolution.is_accelerator
        _seen_type = resolution.type if accelerated else None
        _seen = resolution
        _answers.clear()
    return _seen_type


def as_cuda(value: Any) -> Any:
    """``value`` as the program would see it on CUDA, for a test against ``"cuda"``."""
    kind = _target_type()
    if kind is None:
        return value
    cls = value.__class__
    if cls is CudaSpelled:  # before the cache: it hashes as the plain string
        return value.cuda
    if cls is str or _is_device(value):
        # A torch.device's type and index are built anew at each read, and the same few
        # strings and devices come back at every step: remember each answer.
        seen = _answers.get(value)
        if seen is None:
            seen = _named(value, kind) if cls is str else _device_as_cuda(value, kind)
            if len(_answers) < 512:
                _answers[value] = seen
        return seen
    if cls in (list, tuple, set, frozenset):
        return cls(as_cuda(item) for item in value)
    return value


def _device_as_cuda(value: Any, kind: str) -> Any:
    if value.type != kind:
        return value
    ordinal = _ordinal(value.index)
    if ordinal is False:
        return value
    import torch

    return torch.device("cuda", ordinal)


def is_cuda(obj: Any) -> bool:
    """``obj.is_cuda`` in a target: also true for a tensor on the adapter CUDA stands for."""
    if obj.is_cuda:
        return True
    if _target_type() is None:
        return False
    import torch

    # A tensor's device is read directly: torch 2.4's Dynamo cannot trace hasattr on one.
    device = obj.device if isinstance(obj, torch.Tensor) else getattr(obj, "device", None)
    # On the adapter CUDA stands for, a device is seen as another one: cuda:k.
    return device is not None and as_cuda(device) != device


def _named(text: str, kind: str) -> str:
    """``privateuseone`` → ``cuda``, ``privateuseone:N`` → ``cuda:k``; anything else as it is."""
    found, colon, index = text.partition(":")
    if found != kind:
        return text
    if not colon:
        return "cuda"
    ordinal = _ordinal(int(index)) if index.isdigit() else False
    return text if ordinal is False or ordinal is None else f"cuda:{ordinal}"


def _ordinal(index: Optional[int]) -> Any:
    """The program's CUDA ordinal of adapter ``index`` (None for none); False: no ordinal maps
    to that adapter."""
    if index is None:
        return None
    indices = _resolution.current().indices
    return indices.index(index) if index in indices else False


def _is_device(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and value.__class__ is torch.device
