"""``torch.privateuseone``: the device module torch-directml 0.2.5 registers, mirrored.

torch-directml's ``__init__.py`` registers a ``PrivateUse1Module`` class as the device module
and sets ``torch.storage._StorageBase.privateuseone``. Library code (AMP, serialization,
seeding) asks that module questions; the answers here are DirectML's, including for autocast:
DirectML reports autocast as never enabled, its dtype as float16 and its supported AMP dtypes
as ``[torch.float16]``, and its setters do nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from dmlpatch.sim import _state

_MB = 2**20


class SimModule:
    """Same attributes and answers as torch_directml's ``PrivateUse1Module``."""

    @staticmethod
    def is_available() -> bool:
        return _state.device_count() > 0

    @staticmethod
    def device_count() -> int:
        return _state.device_count()

    @staticmethod
    def device_name(device_id: int) -> str:
        if 0 <= device_id < _state.device_count():
            return _state.device_name(device_id)
        return ""

    @staticmethod
    def default_device() -> int:
        return 0

    @staticmethod
    def device(device_id: int | str | torch.device | None = None) -> torch.device:
        # torch-directml takes an int; torch >= 2.5's storage.to() passes a torch.device and
        # uses the result as a context manager, which torch.device is.
        if isinstance(device_id, (str, torch.device)):
            device_id = torch.device(device_id).index or 0
        count = _state.device_count()
        if device_id is None:
            return torch.device("privateuseone", 0)
        if 0 <= device_id < count:
            return torch.device("privateuseone", device_id)
        # torch_directml raises a bare Exception with this text.
        raise Exception(
            f"Invalid device_id argument supplied {device_id}. "
            f"device_id must be in range [0, {count})."
        )

    @staticmethod
    def disable_tiled_resources(is_disabled: bool) -> None:
        return None

    @staticmethod
    def has_float64_support(device_id: int = 0) -> bool:
        return _state.float64()

    @staticmethod
    def gpu_memory(device_id: int = 0, mb_per_tile: int = 1) -> list[float]:
        """What the adapter's allocator holds, as torch-directml reports it: MB in use per tile
        of ``mb_per_tile`` MB (full tiles, then the part of the last), so that their sum is the
        MB held; ``[0.0]`` when nothing is."""
        if _state.CURRENT is None:
            return [0.0]
        if mb_per_tile <= 0:
            raise ValueError(f"mb_per_tile must be positive, got {mb_per_tile}")
        held = torch.ops.dmlpatch_sim.memory(device_id)[0]
        full, rest = divmod(held, mb_per_tile * _MB)
        tiles = [float(mb_per_tile)] * full
        if rest or not tiles:
            tiles.append(rest / _MB)
        return tiles

    @staticmethod
    def is_autocast_enabled() -> bool:
        return False

    @staticmethod
    def get_autocast_dtype() -> torch.dtype:
        return torch.float16

    @staticmethod
    def set_autocast_enabled(enable: bool) -> None:
        return None

    @staticmethod
    def set_autocast_dtype(dtype: torch.dtype) -> None:
        return None

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16]

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        # Random numbers come from the CPU generator, as on DirectML.
        torch.default_generator.manual_seed(seed)


def storage_to_device(
    self: Any, dev: int | None = None, non_blocking: bool = False, **kwargs: Any
) -> torch.UntypedStorage:
    """``UntypedStorage.privateuseone(dev)``: a copy of the storage on the simulated device.

    torch.load's ``map_location`` and PrivateUse1 deserialisation call this method.
    """
    target = SimModule.device(dev)
    if self.device == target:
        return self
    if self.is_sparse:
        raise RuntimeError("UntypedStorage sparse copy is not supported.")
    result = torch.UntypedStorage(self.size(), device=target)
    result.copy_(self, non_blocking)
    return result


_AUTOCAST_LIBRARY: list[torch.library.Library] = []


def _autocast_passes_through() -> None:
    """Make autocast on privateuseone a no-op, as it is under torch-directml's torch 2.4.1.

    torch 2.4 registers a fallthrough for AutocastPrivateUse1 itself; later releases leave it
    to the backend, and without one every op under ``torch.autocast('privateuseone')`` fails.
    """
    library = torch.library.Library("_", "IMPL")
    if not hasattr(library, "fallback"):
        return  # torch < 2.5: no Library.fallback, and torch registers the fallthrough itself
    try:
        library.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    except RuntimeError:
        return  # torch registered it already
    _AUTOCAST_LIBRARY.append(library)


def install() -> None:
    """Register the module and the storage method, as torch_directml's import does."""
    from torch.storage import _StorageBase

    storage_base: Any = _StorageBase  # torch_directml adds the method torch does not declare
    storage_base.privateuseone = storage_to_device
    torch._register_device_module("privateuseone", SimModule)
    _autocast_passes_through()
