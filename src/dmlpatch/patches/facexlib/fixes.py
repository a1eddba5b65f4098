"""Fixes for facexlib: a hint when a model's weights cannot be downloaded."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from dmlpatch.patches.basicsr.fixes import missing_weights_hint


def download_hint(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """facexlib's ``load_file_from_url``: when the download fails, say where the file must go."""
    url, model_dir, file_name, save_dir = _bind(*args, **kwargs)
    # The same resolution as facexlib.utils.misc.load_file_from_url (0.2.5-0.3.0).
    if model_dir is None:
        model_dir = os.path.join(torch.hub.get_dir(), "checkpoints")
    if save_dir is None:
        save_dir = os.path.join(wrapped.__globals__.get("ROOT_DIR", ""), model_dir)
    name = file_name or os.path.basename(url.split("?", 1)[0])
    try:
        return wrapped(*args, **kwargs)
    except Exception as error:
        missing_weights_hint(url, os.path.join(save_dir, name), error)
        raise


def _bind(
    url: str,
    model_dir: str | None = None,
    progress: bool = True,
    file_name: str | None = None,
    save_dir: str | None = None,
) -> tuple[str, str | None, str | None, str | None]:
    return url, model_dir, file_name, save_dir
