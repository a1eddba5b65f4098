"""Fixes for basicsr (and the StyleGAN2 copies in gfpgan): CUDA-only ops, download hints.

basicsr's StyleGAN2 ops (``fused_leaky_relu``, ``upfirdn2d``) call CUDA extensions that exist
only in a CUDA build of basicsr; the fixes compute the same functions with PyTorch ops, which
run on any device. StyleGAN2's per-pass noise (``normal_``, missing in pytorch-directml 1.8)
needs no fix here: ``dmlpatch.opfix.tensors.random`` serves ``normal_`` on the device for any
library.
Offline, a failed weight download gets a hint saying where the file must go.
"""

from __future__ import annotations

import os
from typing import Any, Callable
from urllib.parse import urlparse

import torch
from torch.nn import functional as F

from dmlpatch import log


def _has_extension(wrapped: Callable[..., Any], name: str, tensor: torch.Tensor) -> bool:
    """The CUDA extension ``name`` was imported by the wrapped function's module and can run."""
    return name in getattr(wrapped, "__globals__", {}) and tensor.is_cuda


def fused_leaky_relu(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``scale * leaky_relu(input + bias, negative_slope)`` with PyTorch ops, no extension."""
    input, bias, negative_slope, scale = _bind_fused(*args, **kwargs)
    if _has_extension(wrapped, "fused_act_ext", input):
        return wrapped(*args, **kwargs)
    # The bias is per channel (dim 1), as in the CUDA kernel and in StyleGAN2's reference code.
    shape = [1, bias.shape[0]] + [1] * (input.ndim - bias.ndim - 1)
    return F.leaky_relu(input + bias.view(shape), negative_slope=negative_slope) * scale


def _bind_fused(
    input: torch.Tensor,
    bias: torch.Tensor,
    negative_slope: float = 0.2,
    scale: float = 2**0.5,
) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    return input, bias, negative_slope, scale


def upfirdn2d(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """basicsr's own pure-PyTorch ``upfirdn2d_native`` wherever the extension cannot run."""
    input, kernel, up, down, pad = _bind_upfirdn2d(*args, **kwargs)
    if input.device.type == "cpu" or _has_extension(wrapped, "upfirdn2d_ext", input):
        return wrapped(*args, **kwargs)
    native = wrapped.__globals__["upfirdn2d_native"]
    return native(input, kernel, up, up, down, down, pad[0], pad[1], pad[0], pad[1])


def _bind_upfirdn2d(
    input: torch.Tensor,
    kernel: torch.Tensor,
    up: int = 1,
    down: int = 1,
    pad: tuple[int, int] = (0, 0),
) -> tuple[torch.Tensor, torch.Tensor, int, int, tuple[int, int]]:
    return input, kernel, up, down, pad


def download_hint(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """basicsr's ``load_file_from_url``: when the download fails, say where the file must go."""
    url, model_dir, file_name = _bind_basicsr_download(*args, **kwargs)
    if model_dir is None:
        model_dir = os.path.join(torch.hub.get_dir(), "checkpoints")
    try:
        return wrapped(*args, **kwargs)
    except Exception as error:
        missing_weights_hint(url, os.path.join(model_dir, file_name or _url_name(url)), error)
        raise


def _bind_basicsr_download(
    url: str, model_dir: str | None = None, progress: bool = True, file_name: str | None = None
) -> tuple[str, str | None, str | None]:
    return url, model_dir, file_name


def missing_weights_hint(url: str, destination: str, error: BaseException) -> None:
    """One line after a failed weight download: the file, where it must go, where it comes from."""
    destination = os.path.abspath(destination)
    if os.path.exists(destination):
        return  # the download was not what failed
    log.say(
        f"hint: {os.path.basename(destination)} could not be downloaded "
        f"({type(error).__name__}); without network, fetch {url} elsewhere and put it at "
        f"{destination}"
    )


def _url_name(url: str) -> str:
    return os.path.basename(urlparse(url).path)
