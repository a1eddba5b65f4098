"""Copies from one DirectML adapter to another, through the host.

DirectML copies a tensor to another adapter as zeros (microsoft/DirectML#443:
``torch.randn(1).to(dml0).to(dml1)`` is ``tensor([0.])``; ``.cpu()`` in between keeps the
value). ``Tensor.to``, the ``.cuda(i)`` and ``.to('cuda:i')`` of rewritten programs and
DataParallel's scatter, replicate and gather (and the backward of each) all copy with
``_to_copy``, which this module serves for device tensors: a copy to another adapter goes to
the host and back (two copies, each a direction DirectML gets right); every other call is the
composite kernel PyTorch gives DirectML, written out: an empty tensor with the layout asked
for (``empty_like`` keeps strides as ``_to_copy`` does), then ``copy_``.

``dst.copy_(src)`` across adapters is DirectML's own ``copy_`` and still gives zeros.
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel

_HOST = torch.device("cpu")


def _to_copy(
    self: torch.Tensor,
    *,
    dtype: Optional[torch.dtype] = None,
    layout: Optional[torch.layout] = None,
    device: Optional[torch.device] = None,
    pin_memory: Optional[bool] = None,
    non_blocking: bool = False,
    memory_format: Optional[torch.memory_format] = None,
) -> torch.Tensor:
    if device is not None and device.type == self.device.type:
        if device.index is None:  # the current adapter, as PyTorch's kernel resolves it
            device = torch.empty(0, device=device).device
        if device.index != self.device.index:
            host = _copy(self, dtype, layout, _HOST, False, memory_format)
            out = _copy(host, None, None, device, False, memory_format)
            nbytes = host.numel() * host.element_size()
            record("fixed", "aten::_to_copy", 2, 2 * nbytes)
            return out
    return _copy(self, dtype, layout, device, non_blocking, memory_format)


def _copy(
    self: torch.Tensor,
    dtype: Optional[torch.dtype],
    layout: Optional[torch.layout],
    device: Optional[torch.device],
    non_blocking: bool,
    memory_format: Optional[torch.memory_format],
) -> torch.Tensor:
    """PyTorch's composite ``_to_copy`` (``TensorConversions.cpp``) for a strided tensor."""
    if layout is not None and layout != self.layout:
        raise RuntimeError(
            "to(options) doesn't support converting to a different layout, but got "
            f"self.layout being {self.layout} and options.layout set as {layout}"
        )
    to_host = device is not None and device.type == "cpu"
    out = torch.empty_like(
        self,
        dtype=dtype,
        device=device,
        pin_memory=non_blocking and to_host,
        memory_format=torch.preserve_format if memory_format is None else memory_format,
    )
    return out.copy_(self, non_blocking=non_blocking)


KERNELS = (Kernel("_to_copy", _to_copy, "quirk", quirk="device-to-device"),)
