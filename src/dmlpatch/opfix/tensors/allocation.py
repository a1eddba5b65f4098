"""Where a tensor of a dtype DirectML cannot hold would come to exist on the device.

A bfloat16, complex or (on some adapters) float64 tensor reaches DirectML by one of three
roads, and each is watched here for those dtypes only (what they become is
:mod:`dmlpatch.opfix.dtype_policy`'s choice):

- **copies**: ``.to(device)``, ``.cuda()``, ``.to(device, dtype)``, ``.to(dtype)`` and
  ``.bfloat16()`` of a device tensor, ``module.to(...)``, safetensors and transformers' loaders:
  all are ``aten::_to_copy``, which :mod:`dmlpatch.opfix.tensors.transfers` serves on DirectML (host
  tensors too: PyTorch selects the kernel by the destination). The copy is cast on the host
  first, so a float16 request of a bfloat16 checkpoint never holds float32 on the device;
- **factories** with ``device=`` (``torch.zeros(..., dtype=torch.bfloat16, device=...)``,
  ``arange``, ``randn``, ``new_zeros``, ...): PyTorch builds them on ``aten::empty`` (and
  DirectML's own ``aten::full``), served here;
- **torch.load** onto the device: storages arrive as bytes and are typed as tensors by
  ``torch._utils._rebuild_tensor``; for an unsupported dtype the bytes are read on the host
  and the tensor copied to the device as above, once per storage, so tensors that shared a
  storage (tied weights, views) still share one.

What this does not see: an operator asked for an unsupported result dtype on the device
(``x.sum(dtype=torch.bfloat16)``), ``torch.empty_strided``/``empty_like`` with such a dtype
(``empty_like`` serves every ``clone``; a kernel in front of it would tax every copy).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch

from dmlpatch.devices import announce as _announce
from dmlpatch.opfix import dtype_policy, sentinels, triggers
from dmlpatch.opfix._accounting import record
from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.complex.tensor import wrap

_native_empty_strided = torch.ops.aten.empty_strided.default


def _policy() -> dtype_policy.Policy:
    chosen = dtype_policy.current()
    assert chosen is not None  # installed with the fixes, after the policy is set
    return chosen


def _strides(size: list[int], memory_format: Optional[torch.memory_format]) -> list[int]:
    if memory_format == torch.channels_last and len(size) == 4:
        _, c, h, w = size
        return [h * w * c, 1, w * c, c]
    if memory_format == torch.channels_last_3d and len(size) == 5:
        _, c, d, h, w = size
        return [d * h * w * c, 1, h * w * c, w * c, c]
    if memory_format not in (None, torch.contiguous_format):
        raise RuntimeError(f"unsupported memory format {memory_format}")
    strides, step = [0] * len(size), 1
    for i in range(len(size) - 1, -1, -1):
        strides[i] = step
        step *= max(size[i], 1)
    return strides


def allocate(
    size: list[int],
    dtype: torch.dtype,
    device: Optional[torch.device],
    pin_memory: Optional[bool] = None,
    memory_format: Optional[torch.memory_format] = None,
) -> torch.Tensor:
    """An uninitialised device tensor as ``torch.empty`` makes one, under the policy: a
    paired complex tensor for a complex dtype, the stored dtype for the others."""
    sentinels.stand_aside()
    triggers.seen(dtype)
    policy = _policy()
    index = device.index if device is not None else None
    if policy.paired(dtype):
        record("fixed", "aten::empty.memory_format")
        part = policy.stored(dtype, index)
        pairs = _native_empty_strided(
            [*size, 2], _strides([*size, 2], None), dtype=part, device=device
        )
        return wrap(pairs)
    stored = policy.stored(dtype, index)
    if stored is not dtype:
        record("fixed", "aten::empty.memory_format")
    return _native_empty_strided(
        size, _strides(size, memory_format), dtype=stored, device=device, pin_memory=pin_memory
    )


#: Dtypes the device holds as they are and no waiting fix watches: their allocations take the
#: short path (every allocation of PyTorch's composite operators comes here).
_plain: frozenset[torch.dtype] = frozenset()
_default_dtype = torch.get_default_dtype
_empty_strided = torch.empty_strided
_CONTIGUOUS = torch.contiguous_format
#: Contiguous strides by shape, for allocations of rank 3 and more (bounded: cleared when full).
_contiguous: dict[tuple[int, ...], tuple[int, ...]] = {}
_CONTIGUOUS_KEPT = 4096


def reset() -> None:
    """As before the fixes were installed: no dtype policy, no dtype allocated plainly."""
    global _plain
    from dmlpatch.opfix import dtype_policy

    _plain = frozenset()
    dtype_policy.reset()


def plain_dtypes(dtypes: frozenset[torch.dtype]) -> None:
    """Set at install, and widened as waiting fixes are installed."""
    global _plain
    _plain = dtypes


def _empty(
    size: list[int],
    *,
    dtype: Optional[torch.dtype] = None,
    layout: Optional[torch.layout] = None,
    device: Optional[torch.device] = None,
    pin_memory: Optional[bool] = None,
    memory_format: Optional[torch.memory_format] = None,
) -> torch.Tensor:
    if _announce.pending:  # the program's first tensor on the device may be made here
        _announce.device_reached()
    wanted = dtype if dtype is not None else _default_dtype()
    if wanted in _plain and (memory_format is None or memory_format is _CONTIGUOUS):
        rank = len(size)
        if rank == 1:
            strides: Any = (1,)
        elif rank == 2:
            strides = (max(size[1], 1), 1)
        else:
            # A step allocates the same shapes every time: their strides are looked up, not
            # computed (the loop was a third of this kernel's time inside a training step).
            shape = tuple(size)
            strides = _contiguous.get(shape)
            if strides is None:
                if len(_contiguous) >= _CONTIGUOUS_KEPT:
                    _contiguous.clear()
                strides = _contiguous[shape] = tuple(_strides(size, None))
        return _empty_strided(size, strides, dtype=wanted, device=device, pin_memory=pin_memory)
    if layout not in (None, torch.strided):
        raise RuntimeError(f"DirectML tensors are strided, not {layout}")
    return allocate(list(size), wanted, device, pin_memory, memory_format)


def _full(
    size: list[int],
    fill_value: Any,
    *,
    dtype: Optional[torch.dtype] = None,
    layout: Optional[torch.layout] = None,
    device: Optional[torch.device] = None,
    pin_memory: Optional[bool] = None,
) -> torch.Tensor:
    if dtype is None:
        # As torch.full infers it: from the Python type of the value.
        dtype = torch.full((), fill_value).dtype
    out = allocate(list(size), dtype, device, pin_memory)
    return out.fill_(fill_value)


# ---- torch.load onto the device ----

_Rebuild = Callable[..., torch.Tensor]
_original_rebuild: Optional[_Rebuild] = None
_original_rebuild_v3: Optional[_Rebuild] = None
#: Device storages already typed and copied, by the storage torch.load made for them.
_typed: weakref.WeakKeyDictionary[Any, torch.Tensor] = weakref.WeakKeyDictionary()


def _through_host(untyped: Any, dtype: torch.dtype) -> torch.Tensor:
    """The whole storage ``untyped`` (on the device, bytes of ``dtype``) as a device tensor
    under the policy, copied through the host once."""
    whole = _typed.get(untyped)
    if whole is None:
        host_bytes = untyped.cpu()
        on_host = torch.empty(0, dtype=dtype).set_(host_bytes)
        whole = on_host.to(untyped.device)
        _typed[untyped] = whole
    return whole


def _needs_host(untyped: Any, dtype: torch.dtype) -> bool:
    if untyped.device.type != "privateuseone":
        return False
    policy = dtype_policy.current()
    if policy is None:
        return False
    return policy.paired(dtype) or policy.stored(dtype, untyped.device.index) is not dtype


def _rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any) -> torch.Tensor:
    untyped = storage._untyped_storage
    if _needs_host(untyped, storage.dtype):
        record("fixed", "aten::set_.source_Storage_storage_offset")
        return _through_host(untyped, storage.dtype).as_strided(size, stride, storage_offset)
    assert _original_rebuild is not None
    return _original_rebuild(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(
    storage: Any,
    storage_offset: int,
    size: Any,
    stride: Any,
    requires_grad: bool,
    backward_hooks: Any,
    dtype: torch.dtype,
    metadata: Any = None,
) -> torch.Tensor:
    untyped = storage._untyped_storage
    assert _original_rebuild_v3 is not None
    if not _needs_host(untyped, dtype):
        return _original_rebuild_v3(
            storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype, metadata
        )
    record("fixed", "aten::set_.source_Storage_storage_offset")
    t = _through_host(untyped, dtype).as_strided(size, stride, storage_offset)
    t.requires_grad_(requires_grad)
    if metadata:
        torch._utils.set_tensor_metadata(t, metadata)
    t._backward_hooks = backward_hooks
    return t


def install_load_hook() -> None:
    """Route ``torch.load``'s tensors of unsupported dtypes on the device through the host."""
    global _original_rebuild, _original_rebuild_v3
    import torch._utils as torch_utils

    if _original_rebuild is None:
        _original_rebuild = torch_utils._rebuild_tensor
        _original_rebuild_v3 = torch_utils._rebuild_tensor_v3
        torch_utils._rebuild_tensor = _rebuild_tensor
        torch_utils._rebuild_tensor_v3 = _rebuild_tensor_v3
        from dmlpatch import changes

        changes.record(
            f"{__name__}:load",
            "function",
            "torch._utils._rebuild_tensor and _rebuild_tensor_v3 (torch.load's tensors)",
            uninstall_load_hook,
        )


def uninstall_load_hook() -> None:
    global _original_rebuild, _original_rebuild_v3
    import torch._utils as torch_utils

    from dmlpatch import changes

    changes.forget(f"{__name__}:load")

    if _original_rebuild is not None:
        torch_utils._rebuild_tensor = _original_rebuild
        torch_utils._rebuild_tensor_v3 = _original_rebuild_v3
        _original_rebuild = _original_rebuild_v3 = None


#: Why no call is cheaper through DirectML's fallback (the registry's ``NO_CHOICE``).
NO_CHOICE = (
    "It keeps tensors of dtypes DirectML cannot hold from being made as such on the device (a "
    "failure or a wrong dtype, not a fallback): no road through the CPU makes them either."
)

KERNELS = (
    Kernel("empty.memory_format", _empty, "dtype"),
    Kernel("full", _full, "dtype"),
)
