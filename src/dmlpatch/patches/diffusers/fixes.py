"""Fixes for diffusers: a pipeline's ``device_map`` that names CUDA, on DirectML.

``DiffusionPipeline.from_pretrained(..., device_map="cuda")`` is how diffusers' documentation
loads a pipeline onto the GPU. diffusers accepts ``"balanced"`` or the one device it found at
import (``get_device()``, rewritten to DirectML's ``"privateuseone:0"``), as a string, and
refuses ``"cuda"``. On DirectML a CUDA device there becomes the adapter it maps to, as a string;
each component's own ``from_pretrained`` then gets that device (transformers' components
through their own fix).
"""

from __future__ import annotations

from typing import Any, Callable

from dmlpatch.devices import resolution
from dmlpatch.runtime import sites as runtime

Wrapper = Callable[..., Any]


def pipeline_device_map_on_directml(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``from_pretrained(..., device_map=...)`` with a CUDA device on the DirectML target."""
    device_map = kwargs.get("device_map")
    target = resolution.current()
    if not isinstance(device_map, str) or not (target.patches_needed and target.is_accelerator):
        return wrapped(*args, **kwargs)
    moved = runtime.device(device_map)
    if moved is device_map:
        return wrapped(*args, **kwargs)
    return wrapped(*args, **{**kwargs, "device_map": str(moved)})
