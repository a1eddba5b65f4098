"""Fixes for yolov5: DirectML device requests and its AMP check.

yolov5's ``select_device`` reads ``--device`` as ultralytics' does (``''``, ``0``, ``0,1``,
``cpu``, ``mps``), so the request is read the same way (``dmlpatch.patches.ultralytics.fixes``):
``dml``, ``dml:N``, ``privateuseone:N`` and ``sim`` name DirectML adapters, and CUDA ordinals
name the target's adapters while dmlpatch targets DirectML.
"""

from __future__ import annotations

import platform
from typing import Any, Callable

import torch

from dmlpatch.devices import announce
from dmlpatch.patches.ultralytics.fixes import (
    NO_AUTOCAST,
    adapter_name,
    amp_checks_skipped,
    directml_request,
)
from dmlpatch.specs.arguments import bound_arguments

Wrapper = Callable[..., Any]


def select_device(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``select_device``: DirectML requests return ``privateuseone:N`` with yolov5's log line."""
    bound = bound_arguments(wrapped, args, kwargs)
    chosen = directml_request(bound.arguments["device"])
    if chosen is None:
        return wrapped(*args, **kwargs)
    announce.device_used()
    namespace = wrapped.__globals__
    version = ""
    describe = namespace.get("git_describe"), namespace.get("file_date")
    for source in describe:
        if callable(source):
            version = source() or ""
            if version:
                break
    line = (
        f"YOLOv5 🚀 {version} Python-{platform.python_version()} torch-{torch.__version__} "
        f"DML:{chosen.index} ({adapter_name(chosen.index or 0)})"
    )
    logger = namespace.get("LOGGER")
    if logger is not None:
        logger.info(line)
    return chosen


def amp_check(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``check_amp``: yolov5's own check where autocast runs on DirectML (float32 against
    float16 autocast on the device; training is AMP when it passes); without the autocast
    kernels, where it would compare float32 with itself, False with one warning in yolov5's
    style (it has no ``amp`` option to name)."""
    from dmlpatch.opfix import installer

    if installer.fix_installed("precision.autocast"):
        return wrapped(*args, **kwargs)
    return amp_checks_skipped(wrapped, args, kwargs, "training in float32.", NO_AUTOCAST)
