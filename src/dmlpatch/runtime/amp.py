"""``torch.autocast('cuda')`` and ``GradScaler`` in rewritten code, where DirectML has no AMP.

Without a CUDA GPU torch switches CUDA autocast and CUDA's GradScaler off with CUDA's warning;
``torch.autocast('privateuseone')`` under torch-directml switches nothing on either: its
operators ignore the autocast key. Either way the run is in float32 while the program believes
it is in mixed precision. Here the program gets the same float32 run, said once and truly.

The rewriter passes the callee it replaced (``torch.autocast``, ``torch.amp.autocast``,
``torch.cuda.amp.autocast``, ``torch.amp.GradScaler``, ``torch.cuda.amp.GradScaler`` or the
same names imported), so any other device type, and any run on a CUDA GPU or on the CPU, calls
it exactly as written.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from dmlpatch import log
from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import on_behalf


def autocast(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``original(*args, **kwargs)``, or a float32 context where it would target DirectML."""
    if _cuda_amp(original):
        device_type: Any = "cuda"
        enabled = kwargs.get("enabled", args[0] if args else True)
    else:
        device_type = kwargs.get("device_type", args[0] if args else None)
        enabled = kwargs.get("enabled", args[2] if len(args) > 2 else True)
    target = _directml_target(device_type)
    if target is None:
        return on_behalf.call(original, args, kwargs, depth=3)  # past sites.py
    if enabled:
        _say(target)
    return _Float32()


def grad_scaler(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``original(*args, **kwargs)``, or a disabled scaler where it would target DirectML.

    A disabled GradScaler is the identity: ``scale`` returns the loss, ``step`` steps, and
    ``update`` does nothing, so the program's AMP training loop runs unchanged in float32.
    """
    if _cuda_amp(original):
        device_type: Any = "cuda"
        enabled = kwargs.get("enabled", args[4] if len(args) > 4 else True)
    else:
        device_type = kwargs.get("device", args[0] if args else "cuda")
        enabled = kwargs.get("enabled", args[5] if len(args) > 5 else True)
    target = _directml_target(device_type)
    if target is None:
        return on_behalf.call(original, args, kwargs, depth=3)  # past sites.py
    if enabled:
        _say(target)
    import torch

    return torch.amp.GradScaler("cuda", enabled=False)


def say_off() -> None:
    """The line a program's autocast gets where DirectML makes it float32 (said once)."""
    _say(_resolution.current())


def off_on_directml(device_type: Any) -> bool:
    """Whether autocast for ``device_type`` is off here because it would target DirectML (the
    run is float32): for libraries that prepare their inputs for autocast themselves."""
    return _directml_target(device_type) is not None


class _Float32:
    """What autocast is where there is no AMP: a context (or decorator) that changes nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def float32(*args: Any, **kwargs: Any) -> Any:
            with self:
                return function(*args, **kwargs)

        return float32


def _cuda_amp(original: Any) -> bool:
    """``torch.cuda.amp.autocast`` / ``GradScaler``: CUDA by name, with positional options."""
    return str(getattr(original, "__module__", "")).startswith("torch.cuda.amp")


def _directml_target(device_type: Any) -> Optional[_resolution.Resolution]:
    resolution = _resolution.current()
    if not (resolution.patches_needed and resolution.is_accelerator):
        return None
    # A rewritten program's device string carries an index ('privateuseone:0').
    kind = str(getattr(device_type, "type", device_type)).split(":")[0]
    if kind in ("cuda", resolution.type):
        return resolution
    return None


def _say(target: _resolution.Resolution) -> None:
    log.warn_once(
        "amp",
        "DirectML has no mixed precision (AMP): the program's autocast and GradScaler are off "
        f"and it runs in float32 on {target.device}",
    )
