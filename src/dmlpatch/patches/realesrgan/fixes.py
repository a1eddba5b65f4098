"""Fixes for realesrgan: half precision only where the device runs it natively."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from dmlpatch import log
from dmlpatch.devices import resolution
from dmlpatch.runtime import sites as runtime

#: Backends whose float16 kernels are native. The CPU's are missing (older torch) or about
#: 100x slower than float32 (RRDBNet, torch 2.14), and the simulated DirectML device computes
#: with the CPU's kernels, so neither is in the list.
HALF_BACKENDS = frozenset({"directml", "cuda", "mps", "xpu"})


def half_where_supported(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``RealESRGANer(half=True)`` runs in float32 on a device without native float16."""
    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    arguments = bound.arguments
    if not arguments.get("half"):
        return wrapped(*args, **kwargs)
    device = arguments.get("device")
    if device is None:
        # What the rewritten __init__ picks: the target when it is an accelerator, else the CPU.
        gpu_id = arguments.get("gpu_id")
        device = runtime.device(f"cuda:{gpu_id}" if gpu_id else "cuda")
    if not keeps_half(resolution.current().backend, torch.device(device).type):
        log.info(f"realesrgan: half=True on {device} runs in float32 (no native float16 there)")
        arguments["half"] = False
    return wrapped(*bound.args, **bound.kwargs)


def keeps_half(backend: str, device_type: str) -> bool:
    """Whether float16 stays: the device is the target's and the target has native float16."""
    if device_type == "cpu":
        return False
    return backend in HALF_BACKENDS
