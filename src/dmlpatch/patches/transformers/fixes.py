"""Fixes for transformers: a ``device_map`` that names CUDA, on DirectML.

``device_map`` reaches ``from_pretrained`` as a value (a string, an ordinal, a ``torch.device``
or a dict of them), often built far from the call, so no rewritten site sees it. On DirectML its
CUDA devices become the adapters they map to, as ``'cuda:N'`` does at every rewritten site;
``'auto'`` and the other strategies are accelerate's, whose own CUDA sites are rewritten; CPU
and disk entries stay as they are.
"""

from __future__ import annotations

from typing import Any, Callable

from dmlpatch.devices import resolution
from dmlpatch.runtime import sites as runtime

Wrapper = Callable[..., Any]


def device_map_on_directml(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``from_pretrained(..., device_map=...)`` with its CUDA devices on the DirectML target."""
    device_map = kwargs.get("device_map")
    target = resolution.current()
    if device_map is None or not (target.patches_needed and target.is_accelerator):
        return wrapped(*args, **kwargs)
    if isinstance(device_map, dict):
        translated: Any = {name: _on_target(value) for name, value in device_map.items()}
    else:
        translated = _on_target(device_map)
    return wrapped(*args, **{**kwargs, "device_map": translated})


def _on_target(value: Any) -> Any:
    """A CUDA device (``'cuda'``, ``'cuda:1'``, ``1``, ``torch.device('cuda', 1)``) as the target's
    adapter; anything else (``'cpu'``, ``'disk'``, ``'auto'``) unchanged.

    As a ``torch.device``, which is what transformers makes of a device string itself: given
    the string, it hands ``'privateuseone:0'`` to safetensors, which knows only CUDA's names.
    """
    if isinstance(value, bool):
        return value
    moved = runtime.device(value)
    if moved is value or not isinstance(moved, str) or ":" not in moved:
        return moved
    import torch

    return torch.device(moved)
