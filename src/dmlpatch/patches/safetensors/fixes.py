"""Fixes for safetensors: ``load_file(path, device=...)`` onto a DirectML adapter.

safetensors' loaders accept the devices it knows by name (``cpu``, ``cuda``, ``mps``, ...) and
refuse ``privateuseone``: ``SafetensorError: device privateuseone:0 is invalid``. A program's
``load_file(path, device='cuda')`` becomes exactly that once its CUDA site is rewritten for
DirectML. The file is read on the host instead, and each tensor copied to the adapter, which is
what safetensors does for CUDA too (it reads into host memory first); a bfloat16 tensor then
arrives under dmlpatch's dtype policy like any other copy.
"""

from __future__ import annotations

from typing import Any, Callable

Wrapper = Callable[..., Any]


def load_file_onto_directml(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``load_file(filename, device=...)`` with a DirectML device: read, then copy over."""
    device = kwargs.get("device", args[1] if len(args) > 1 else "cpu")
    if not _is_directml(device):
        return wrapped(*args, **kwargs)
    filename = kwargs.get("filename", args[0] if args else None)
    on_host = wrapped(filename, device="cpu")
    return {name: tensor.to(device) for name, tensor in on_host.items()}


def _is_directml(device: Any) -> bool:
    kind = getattr(device, "type", None)
    if kind is None and isinstance(device, str):
        kind = device.split(":", 1)[0]
    return kind == "privateuseone"
