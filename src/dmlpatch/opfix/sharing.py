"""A device tensor handed to another process stops with one line that says why and what to do.

``torch.multiprocessing`` pickles a tensor for a child process by sharing its memory: a CPU
tensor's through a shared file, a CUDA tensor's through CUDA's inter-process handles, so that
Hogwild-style workers (``model.share_memory()``, then ``mp.Process(target=train,
args=(model,))``) update one set of weights. DirectML has no inter-process memory, so PyTorch
tries the CPU's way and stops with ``RuntimeError: _share_fd_: only available on CPU`` (with
the *spawn* start method, Windows' only one; *fork* copies the process and shares nothing).
Weights kept in host memory and copied to the device in each worker would no longer be one set
of weights, so nothing can make this run as on CUDA: the reducers of ``torch.Tensor``,
``Parameter`` and storages say so in one line instead, for tensors on ``privateuseone`` only
(catalogue entry ``shared-memory``); every other tensor is pickled by PyTorch's own reducer.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

#: The reducers this module replaced, by class, while installed.
_originals: dict[type, Callable[..., Any]] = {}
_lock = threading.Lock()

MESSAGE = (
    "a tensor on {device} cannot be handed to another process: DirectML has no inter-process "
    "memory (CUDA's IPC has no DirectML counterpart), so workers cannot share the model's "
    "weights on the device (catalogue entry shared-memory); move the model to the device inside "
    "each worker, or train in one process"
)


def _on_device(value: Any) -> bool:
    # A TypedStorage warns that it is deprecated when asked its device: ask what it wraps.
    device = getattr(getattr(value, "_untyped_storage", value), "device", None)
    return getattr(device, "type", None) == "privateuseone"


def _refusing(original: Callable[..., Any]) -> Callable[..., Any]:
    def reduce(value: Any) -> Any:
        if _on_device(value):
            raise RuntimeError(MESSAGE.format(device=value.device))
        return original(value)

    return reduce


def install() -> None:
    """Put the refusing reducers in front of PyTorch's; idempotent."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # registers PyTorch's reducers

    with _lock:
        if _originals:
            return
        for cls in (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.TypedStorage):
            # multiprocessing's registry of reducers (typeshed does not list it).
            reducers: dict[type, Callable[..., Any]] = vars(ForkingPickler)["_extra_reducers"]
            original = reducers.get(cls)
            if original is not None:
                _originals[cls] = original
                ForkingPickler.register(cls, _refusing(original))


def uninstall() -> None:
    """PyTorch's reducers back."""
    from multiprocessing.reduction import ForkingPickler

    with _lock:
        for cls, original in _originals.items():
            ForkingPickler.register(cls, original)
        _originals.clear()
