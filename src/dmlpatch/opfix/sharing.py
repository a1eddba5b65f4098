"""What a worker process receives of the device: the device itself, and never its tensors.

``torch.multiprocessing`` pickles a tensor for a child process by sharing its memory: a CPU
tensor's through a shared file, a CUDA tensor's through CUDA's inter-process handles, so that
Hogwild-style workers (``model.share_memory()``, then ``mp.Process(target=train,
args=(model,))``) update one set of weights. DirectML has no inter-process memory, so PyTorch
tries the CPU's way and stops with ``RuntimeError: _share_fd_: only available on CPU`` (with
the *spawn* start method, Windows' only one; *fork* copies the process and shares nothing).
A model the program shares with ``model.share_memory()`` never gets here: its weights are in
host memory (:mod:`dmlpatch.opfix.shared_modules`). Any other device tensor cannot cross as it
would on CUDA, and a copy would not be the tensor the parent holds: the reducers of
``torch.Tensor``, ``Parameter`` and storages say so in one line, for tensors on
``privateuseone`` only (catalogue entry ``shared-memory``); every other tensor is pickled by
PyTorch's own reducer.

A ``torch.device("privateuseone:0")`` crosses as it is, but a spawned worker knows that device
only once it has committed to dmlpatch's, which it does at its first CUDA site; a worker that
is handed the device (``mp.Process(target=train, args=(model, device))``, then ``x.to(device)``)
has none, and stopped with ``ModuleNotFoundError: No module named 'torch.privateuseone'``. So
the device's reducer makes the worker commit as it unpickles the device.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from dmlpatch import changes

#: The reducers this module replaced, by class, while installed.
_originals: dict[type, Callable[..., Any]] = {}
_lock = threading.Lock()

MESSAGE = (
    "a tensor on {device} cannot be handed to another process: DirectML has no inter-process "
    "memory (CUDA's IPC has no DirectML counterpart), so workers cannot share the model's "
    "weights on the device (catalogue entry shared-memory); share the model with "
    "model.share_memory() (its weights then stay in host memory), move it to the device inside "
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


def arriving_device(kind: str, index: Optional[int]) -> Any:
    """A device unpickled in a worker, after the worker has committed to dmlpatch's device
    (where dmlpatch is active in it), so that torch knows ``privateuseone``."""
    from dmlpatch.rewriting import hook

    if hook.is_installed():  # a worker dmlpatch started: its start-up's hook is in
        from dmlpatch.devices import resolution

        resolution.current()
    import torch

    return torch.device(kind, index)


def _reduce_device(device: Any) -> Any:
    if device.type == "privateuseone":
        return arriving_device, (device.type, device.index)
    return device.__reduce__()


def install() -> None:
    """Put the refusing reducers in front of PyTorch's, and the device's; idempotent."""
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
        ForkingPickler.register(torch.device, _reduce_device)
        changes.record(
            __name__,
            "reducers",
            "multiprocessing's reducers of device tensors, storages and torch.device",
            uninstall,
        )


def uninstall() -> None:
    """PyTorch's reducers back."""
    from multiprocessing.reduction import ForkingPickler

    changes.forget(__name__)
    with _lock:
        for cls, original in _originals.items():
            ForkingPickler.register(cls, original)
        _originals.clear()
        vars(ForkingPickler)["_extra_reducers"].pop(_device_type(), None)


def _device_type() -> Any:
    import sys

    torch = sys.modules.get("torch")
    return getattr(torch, "device", None)
