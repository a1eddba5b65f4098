"""Which Python line ran a piece of compute, and whether it was data loading.

A CPU convolution inside a ``DataLoader``'s fetch (a blur in a dataset's ``__getitem__``) or a
torchvision transform is pre-processing, not the model; the same convolution called from a
model's ``forward`` is model compute that should have been on the device. The frames above the
call say which: the innermost frame outside torch and dmlpatch is where the program (or a
library) ran it, and a frame of torch's data loading or torchvision's transforms on the way up
marks it as data work.

A forward run while a module is still being built (an ``nn.Module``'s ``__init__`` on the
stack) is set-up: libraries probe shapes that way before the model is placed (ultralytics runs
its new detection model once on a CPU tensor for its strides, ``AutoBackend`` while loading
weights). That is not model compute the program meant for the device either.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import NamedTuple, Optional

import torch
from torch import nn

from dmlpatch import origins

_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_DMLPATCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# torchvision, torchaudio and torch-directml sit beside torch and count as torch's own code too
# (the line that matters is the one that called into them); torch_geometric and torchmetrics
# sit there too but are libraries like any other, so each is named, not torch's prefix.
_OWN = (
    *(
        os.path.join(os.path.dirname(_TORCH), name) + os.sep
        for name in ("torch", "torchvision", "torchaudio", "torch_directml", "functorch")
    ),
    _DMLPATCH,
)
_LOADING = (
    os.path.join(_TORCH, "utils", "data") + os.sep,
    os.sep + os.path.join("torchvision", "transforms") + os.sep,
    os.sep + os.path.join("torchvision", "io") + os.sep,
)


class Site(NamedTuple):
    """A line of the program's or a library's code."""

    file: str
    line: int
    function: str

    def describe(self) -> str:
        return f"{display(self.file)}:{self.line} in {self.function}"


class Caller(NamedTuple):
    site: Optional[Site]  # None: no frame outside torch and dmlpatch (autograd's threads)
    loading: bool
    building: bool  # under an nn.Module's __init__


def internal(path: str) -> bool:
    """A file of torch (and its siblings) or dmlpatch, one Python made up (``<frozen ...>``,
    ``<string>``) or one a package wrote at run time (:mod:`dmlpatch.origins`): never the line
    where the program ran something."""
    if path.startswith("<"):
        return True
    if not os.path.isabs(path):
        path = os.path.abspath(path)
    return path.startswith(_OWN) or origins.generated(path)


def display(path: str) -> str:
    """Relative to the working directory when under it, else as it is."""
    if not os.path.isabs(path):
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def caller(depth: int = 1) -> Caller:
    """The innermost frame outside torch and dmlpatch above the caller's ``depth``-th frame,
    and whether data loading, a transform or a module's construction is on the stack."""
    frame = _frame_above(depth + 1)
    site: Optional[Site] = None
    loading = building = False
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if site is None and not internal(path):
            site = Site(path, frame.f_lineno, code.co_name)
        if any(part in path for part in _LOADING):
            loading = True
            break
        if code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), nn.Module):
            building = True
            break
        frame = frame.f_back
    return Caller(site, loading, building)


def site(depth: int = 1) -> Optional[Site]:
    """The innermost frame outside torch and dmlpatch above the caller's ``depth``-th frame:
    :func:`caller` without the walk to the top that data loading and set-up need."""
    frame = _frame_above(depth + 1)
    while frame is not None:
        code = frame.f_code
        if not internal(code.co_filename):
            return Site(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


def _frame_above(depth: int) -> Optional[FrameType]:
    """The frame ``depth`` levels above this function's caller, or None where the stack is
    not that deep: on autograd's device thread torch 2.4 calls a dispatch mode straight from
    C++, so the mode's own frame is the thread's only one (torch 2.14 adds Dynamo's two)."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None
