"""Fixes for accelerate: mixed precision on DirectML.

``Accelerator(mixed_precision="fp16")`` checks the device's name against the devices with AMP
and refuses ``privateuseone``; ``"bf16"`` likewise. DirectML has no AMP at all (its operators
ignore autocast), so where the program's own ``torch.autocast`` runs in float32 with one line
(:mod:`dmlpatch.runtime.amp`), an ``Accelerator`` does the same: it is made with
``mixed_precision="no"`` and the line is said once. ``accelerate launch --mixed_precision``
reaches ``Accelerator`` through ``ACCELERATE_MIXED_PRECISION``, read here the same way.
"""

from __future__ import annotations

import os
from typing import Any, Callable

Wrapper = Callable[..., Any]

_MIXED = ("fp16", "bf16", "fp8")


def float32_on_directml(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Accelerator(...)`` in float32 where its mixed precision would target DirectML."""
    from dmlpatch.runtime import amp

    asked = kwargs.get("mixed_precision")
    if asked is None:
        asked = os.environ.get("ACCELERATE_MIXED_PRECISION")
    asked = str(getattr(asked, "value", asked) or "no").lower()
    if asked in _MIXED and not kwargs.get("cpu") and amp.off_on_directml("cuda"):
        amp.say_off()
        kwargs = {**kwargs, "mixed_precision": "no"}
    return wrapped(*args, **kwargs)
