"""A simulated DirectML device: a real PyTorch ``privateuseone`` backend over CPU memory.

Kernels are the CPU kernels, so results equal a CPU run; DirectML's gaps (CPU fallbacks,
refused arguments, missing float64) come from the profile table in
:mod:`dmlpatch.gaps.profiles`.
Importing this package imports neither torch nor the extension; :func:`load` does both.

Environment: ``DMLPATCH_SIM_PROFILE`` (profile), ``DMLPATCH_SIM_DEVICES`` (adapters, default 1),
``DMLPATCH_SIM_FLOAT64=0`` (no float64 support), ``DMLPATCH_TRACE=1`` (record the stack of the
first call of each fallback/refused op), ``DMLPATCH_SIM_FAULT=drop-scalar-writes`` (single-element
writes silently do nothing, as reported for DirectML).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dmlpatch.errors import DeviceUnavailable
from dmlpatch.gaps import profiles as _profiles
from dmlpatch.sim import _state

if TYPE_CHECKING:
    import torch

__all__ = [
    "buildable",
    "counters",
    "device",
    "device_count",
    "device_name",
    "has_float64",
    "is_loaded",
    "load",
    "max_memory_allocated",
    "memory_allocated",
    "precheck",
    "profile",
    "profiles",
    "reset_counters",
    "reset_peak_memory",
]


def load(profile: str | None = None) -> None:
    """Build (first use only) and load the simulated device; idempotent.

    ``profile`` defaults to ``$DMLPATCH_SIM_PROFILE``, else ``torch-directml-0.2.5``. Raises
    :class:`~dmlpatch.errors.DeviceUnavailable` with a one-line reason when the device cannot
    be used (no compiler, unknown profile, torch_directml imported, build failure).
    """
    from dmlpatch.sim import backend

    backend.load(profile)


def precheck(profile: str | None = None) -> list[str]:
    """What :func:`load` would refuse that needs no torch (profile, environment); the adapter
    names :func:`load` would give. Raises :class:`~dmlpatch.errors.DeviceUnavailable`."""
    from dmlpatch.sim import backend

    _profiles.resolve(profile)
    devices = backend.env_settings()[0]
    return [_state.device_name(index, devices) for index in range(devices)]


def is_loaded() -> bool:
    """Whether :func:`load` has succeeded in this process."""
    return _state.CURRENT is not None


def _require() -> _state.Loaded:
    if _state.CURRENT is None:
        raise DeviceUnavailable("the simulated DirectML device is not loaded (call load())")
    return _state.CURRENT


def device(index: int = 0) -> torch.device:
    """``torch.device('privateuseone', index)``."""
    import torch

    loaded = _require()
    if not 0 <= index < loaded.devices:
        raise DeviceUnavailable(
            f"simulated adapter {index} does not exist; there are {loaded.devices}"
        )
    return torch.device("privateuseone", index)


def device_count() -> int:
    """Number of simulated adapters (0 before :func:`load`)."""
    return _state.device_count()


def device_name(index: int = 0) -> str:
    """The adapter's name, e.g. ``Simulated Radeon (discrete)``."""
    loaded = _require()
    if not 0 <= index < loaded.devices:
        raise DeviceUnavailable(
            f"simulated adapter {index} does not exist; there are {loaded.devices}"
        )
    return _state.device_name(index)


def has_float64() -> bool:
    """Whether the simulated adapters have float64 (``DMLPATCH_SIM_FLOAT64=0``: none has)."""
    return _require().float64


def profile() -> str:
    """The loaded profile's name (the one :func:`load` would use, before loading)."""
    if _state.CURRENT is not None:
        return _state.CURRENT.profile
    return _profiles.resolve().name


def profiles() -> list[str]:
    """Valid profile names, default first."""
    return _profiles.names()


def counters() -> dict[str, Any]:
    """Transfers, syncs, per-operator calls and copies since the last reset (JSON-able).

    ``{"transfers": {"h2d"|"d2h"|"d2d": {"count", "bytes"}}, "syncs": n,
    "ops": {"native"|"fixed"|"fallback"|"refused": {op: calls}},
    "copies": {op: {"count", "bytes"}}, "first_calls": {op: stack}}``.
    """
    _require()
    from dmlpatch.sim import counting as _counters

    return _counters.snapshot()


def reset_counters() -> None:
    """Zero every counter and forget recorded first-call stacks."""
    _require()
    from dmlpatch.sim import counting as _counters

    _counters.reset()


def _memory(index: int) -> list[int]:
    import torch

    device(index)  # the same refusal as for an adapter that does not exist
    return list(torch.ops.dmlpatch_sim.memory(index))


def memory_allocated(index: int = 0) -> int:
    """Bytes adapter ``index``'s allocator holds now: its live storages' sizes (a CPU
    fallback's results included, which DirectML copies into allocations of its own)."""
    return _memory(index)[0]


def max_memory_allocated(index: int = 0) -> int:
    """The most bytes adapter ``index``'s allocator held at once since
    :func:`reset_peak_memory` (else since :func:`load`), whenever that was."""
    return _memory(index)[1]


def reset_peak_memory(index: int = 0) -> None:
    """Start adapter ``index``'s peak again from what it holds now (counters keep theirs)."""
    import torch

    device(index)
    torch.ops.dmlpatch_sim.reset_peak_memory(index)


def buildable() -> tuple[bool, str]:
    """Whether the extension can be compiled here (a C++ compiler and ninja), and why not."""
    from dmlpatch.sim import build

    return build.buildable()
