"""Fixes for accelerate: bfloat16 mixed precision on DirectML.

``Accelerator(mixed_precision="fp16")`` needs no fix: accelerate refuses a device whose type is
not in its list of devices with AMP, a test of the device that discovery rewrites to answer as
on CUDA, and its ``torch.autocast`` and ``GradScaler`` are sites that
:mod:`dmlpatch.runtime.amp` serves on the DirectML device (float16 autocast, a GradScaler on the
device). ``"bf16"`` asks ``is_bf16_available()`` instead, whose answer on DirectML is
``torch.cuda.is_bf16_supported()``: False, as on a GPU older than Ampere, and accelerate refuses
the run (``Accelerator`` and ``accelerate launch --mixed_precision bf16`` alike). On DirectML
the answer is yes: the region's bfloat16 autocast then runs as the program's own would
(float32, said once, or float16 with ``DMLPATCH_BF16=float16``).
"""

from __future__ import annotations

from typing import Any, Callable

from dmlpatch.devices import resolution

Wrapper = Callable[..., Any]


def bf16_on_directml(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``is_bf16_available(...)`` where accelerate decides whether ``"bf16"`` can run: True on
    DirectML, whose bfloat16 autocast :mod:`dmlpatch.runtime.amp` serves."""
    target = resolution.current()
    if target.patches_needed and target.is_accelerator:
        return True
    return wrapped(*args, **kwargs)
