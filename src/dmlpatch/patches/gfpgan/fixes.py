"""Fixes for gfpgan: checkpoints saved from a CUDA GPU load where CUDA is absent."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

_scope = threading.local()
_registered = False
_lock = threading.Lock()


def cuda_checkpoints_on_cpu(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``GFPGANer.__init__``: its ``torch.load(model_path)`` maps CUDA storages to the CPU.

    Only loads made by this thread during this call are affected; GFPGANer moves the model
    to its device itself right after loading.
    """
    _register()
    depth = getattr(_scope, "depth", 0)
    _scope.depth = depth + 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        _scope.depth = depth


def _register() -> None:
    global _registered
    with _lock:
        if _registered:
            return
        # Ahead of torch's own CPU (10) and CUDA (20) entries; answers None (= not mine)
        # outside a wrapped call, so every other torch.load is untouched.
        torch.serialization.register_package(5, _never_tag, _cuda_to_cpu)
        _registered = True


def _never_tag(storage: Any) -> None:
    """Saving is never affected."""
    return None


def _cuda_to_cpu(storage: Any, location: str) -> Any:
    if getattr(_scope, "depth", 0) and location.startswith("cuda") and not _cuda_usable():
        return storage  # deserialized on the CPU already; torch would move it to CUDA
    return None


def _cuda_usable() -> bool:
    return torch.cuda.is_available()
