"""``Tensor.to`` on DirectML: copies between adapters through the host, and the dtypes
DirectML cannot hold.

Every ``Tensor.to``, ``.cuda()``, ``.bfloat16()``, ``module.to(...)`` and DataParallel's
scatter, replicate and gather copy with ``aten::_to_copy``; PyTorch selects the DirectML kernel
for it whenever the source or the destination is a DirectML tensor. This module serves it, for
two of DirectML's failures:

- **another adapter**: DirectML copies a tensor to another adapter as zeros
  (microsoft/DirectML#443: ``torch.randn(1).to(dml0).to(dml1)`` is ``tensor([0.])``;
  ``.cpu()`` in between keeps the value), so such a copy goes to the host and back (two
  copies, each a direction DirectML gets right);
- **bfloat16, complex, float64 without adapter support** (:mod:`dmlpatch.opfix.dtype_policy`):
  the destination dtype is the policy's, and the cast happens on the host before the copy
  (a bfloat16 checkpoint asked for as float16 never holds float32 on the device); complex
  tensors become :class:`~dmlpatch.opfix.complex.tensor.PairedComplex`.

Every other call is the composite kernel PyTorch gives DirectML, written out: an empty tensor
with the layout asked for (``empty_like`` keeps strides as ``_to_copy`` does), then ``copy_``.
``dst.copy_(src)`` across adapters is DirectML's own ``copy_`` and still gives zeros.
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlpatch.devices import announce as _announce
from dmlpatch.opfix import dtype_policy, triggers
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.complex.tensor import wrap

_HOST = torch.device("cpu")

#: Whether copies to another adapter go through the host: the profile has DirectML's quirk and
#: there is more than one adapter (:func:`between_adapters`).
through_host_between_adapters = False
#: Dtypes (source or destination) that DirectML cannot hold: their copies follow the policy.
_attention: frozenset[torch.dtype] = frozenset()
#: Dtypes a waiting fix watches for (:mod:`dmlpatch.opfix.triggers`).
_waiting: frozenset[torch.dtype] = frozenset()
#: Either of the two: a copy of none of these dtypes takes the short path.
_watched: frozenset[torch.dtype] = frozenset()
_empty_like = torch.empty_like
_PRESERVE = torch.preserve_format


def between_adapters(quirk: bool, adapters: int) -> None:
    """Copies between adapters go through the host where DirectML has the quirk and a copy
    between adapters can happen at all (set at install)."""
    global through_host_between_adapters
    through_host_between_adapters = quirk and adapters > 1


def reset() -> None:
    """As before the fixes were installed: every copy takes the short path."""
    global through_host_between_adapters, _attention, _waiting, _watched
    through_host_between_adapters = False
    _attention = _waiting = _watched = frozenset()


def watch_triggers(dtypes: frozenset[torch.dtype]) -> None:
    global _waiting, _watched
    _waiting = dtypes
    _watched = _attention | _waiting


def held_otherwise() -> frozenset[torch.dtype]:
    """The dtypes DirectML cannot hold as they are: the policy decides what they become."""
    return _attention


def watch_dtypes(dtypes: frozenset[torch.dtype]) -> None:
    """The dtypes whose copies to the device take the policy's path (set at install)."""
    global _attention, _watched
    _attention = dtypes
    _watched = _attention | _waiting


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
    # Every copy of a device tensor and to the device passes here: the calls no fix concerns
    # are told apart with as few Python operations as possible (benchmarks/ops.py).
    if _announce.pending:  # the program's first tensor on the device may come this way
        _announce.device_reached()
    if dtype in _watched or self.dtype in _watched or through_host_between_adapters:
        fixed = _fixed_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)
        if fixed is not None:
            return fixed
    if layout is not None or pin_memory:
        return _copy(self, dtype, layout, device, non_blocking, memory_format)
    # PyTorch's composite kernel for a strided tensor, in the fewest calls from Python.
    out = _empty_like(self, dtype=dtype, device=device, memory_format=memory_format or _PRESERVE)
    return out.copy_(self, non_blocking=non_blocking)


def _fixed_copy(
    self: torch.Tensor,
    dtype: Optional[torch.dtype],
    layout: Optional[torch.layout],
    device: Optional[torch.device],
    pin_memory: Optional[bool],
    non_blocking: bool,
    memory_format: Optional[torch.memory_format],
) -> Optional[torch.Tensor]:
    """A copy to the device that a fix serves (the dtype policy, another adapter), or None
    after telling the triggers of the dtype it brings."""
    wanted = self.dtype if dtype is None else dtype
    target = self.device if device is None else device
    if target.type != "privateuseone":
        return None
    if wanted in _attention or self.dtype in _attention:
        return _to_copy_under_policy(
            self, dtype, layout, target, pin_memory, non_blocking, memory_format
        )
    if wanted in _waiting:
        triggers.seen(wanted)
    if through_host_between_adapters and _another_adapter(self, target):
        return _through_host(self, dtype, layout, target, memory_format)
    return None


def _another_adapter(self: torch.Tensor, target: torch.device) -> bool:
    if self.device.type != target.type:
        return False
    index = target.index if target.index is not None else torch.empty(0, device=target).device.index
    return self.device.index != index


def _through_host(
    self: torch.Tensor,
    dtype: Optional[torch.dtype],
    layout: Optional[torch.layout],
    target: torch.device,
    memory_format: Optional[torch.memory_format],
) -> torch.Tensor:
    host = _copy(self, dtype, layout, _HOST, False, memory_format)
    if target.index is None:
        target = torch.empty(0, device=target).device
    out = _copy(host, None, None, target, False, memory_format)
    nbytes = host.numel() * host.element_size()
    record("fixed", "aten::_to_copy", 2, 2 * nbytes)
    return out


def _to_copy_under_policy(
    self: torch.Tensor,
    dtype: Optional[torch.dtype],
    layout: Optional[torch.layout],
    target: torch.device,
    pin_memory: Optional[bool],
    non_blocking: bool,
    memory_format: Optional[torch.memory_format],
) -> torch.Tensor:
    """A copy to the device whose dtype (asked for, or the source's) DirectML cannot hold."""
    if target.index is None:  # the current adapter, as PyTorch's kernel resolves it
        target = torch.empty(0, device=target).device
    policy = dtype_policy.current()
    assert policy is not None  # _attention is empty without a policy
    wanted = self.dtype if dtype is None else dtype
    if policy.paired(wanted) or self.is_complex():
        return _to_paired(self, wanted, target, policy, non_blocking)
    stored = policy.stored(wanted, target.index)
    if stored is not wanted:
        record("fixed", "aten::_to_copy")
        if self.device.type == "cpu":
            self = self.to(stored)  # cast on the host: the device holds only `stored`
        dtype = stored
    if through_host_between_adapters and _another_adapter(self, target):
        return _through_host(self, dtype, layout, target, memory_format)
    return _copy(self, dtype, layout, target, non_blocking, memory_format)


def _to_paired(
    self: torch.Tensor,
    wanted: torch.dtype,
    target: torch.device,
    policy: dtype_policy.Policy,
    non_blocking: bool,
) -> torch.Tensor:
    """A complex tensor (or a complex source) arriving on the device."""
    record("fixed", "aten::_to_copy")
    if not wanted.is_complex:
        # Complex to real: the real part, with PyTorch's own warning, cast where it is.
        return _copy(self.to(wanted), None, None, target, non_blocking, None)
    part = policy.stored(wanted, target.index)
    if self.is_complex():
        pairs = torch.view_as_real(self.resolve_conj())
    else:
        real = self.to(part)
        pairs = torch.stack((real, torch.zeros_like(real)), dim=-1)
    if self.device.type == "cpu" and pairs.dtype is not part:
        pairs = pairs.to(part)
    return wrap(_copy(pairs, part, None, target, non_blocking, torch.contiguous_format))


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


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "It fixes the copies DirectML gets wrong (zeros between adapters) and the dtypes it cannot "
    "hold, and every other call is DirectML's own copy: a wrong answer is not a cheaper one."
)

KERNELS = (Kernel("_to_copy", _to_copy, "dtype", quirk="device-to-device"),)
