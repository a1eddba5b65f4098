"""What dmlpatch can learn about a DirectML adapter beyond its name: its memory.

torch-directml names its adapters and reports the memory its own allocator holds
(``gpu_memory(i, mb_per_tile)``: MB in use per tile), but not how much the adapter has. On
Windows the display driver records that in the registry, beside the adapter's name; elsewhere
(WSL2 included) it is unknown, and callers say so rather than invent a figure.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

#: The display adapters' device class: one numbered subkey per adapter driver.
_DISPLAY_CLASS = r"SYSTEM\CurrentControlSet\Control\Class\{4d36e968-e325-11ce-bfc1-08002be10318}"
#: The size the driver recorded: a QWORD on current drivers, 4 bytes (or a DWORD) on old ones.
_MEMORY_VALUES = ("HardwareInformation.qwMemorySize", "HardwareInformation.MemorySize")
#: What the simulated device says its adapters have (it allocates from the host's memory).
SIMULATED_MEMORY = 8 * 2**30


def total_memory(backend: str, name: str) -> Optional[int]:
    """Bytes of dedicated memory the adapter called ``name`` has; None where unknown."""
    if backend == "sim":
        return SIMULATED_MEMORY
    if backend == "directml" and sys.platform == "win32":
        return _registry_memory(name)
    return None


def memory_in_use(backend: str, index: int) -> int:
    """Bytes torch-directml's allocator holds on adapter ``index`` (its ``gpu_memory``)."""
    module = _device_module(backend)
    if module is None:
        return 0
    try:
        tiles = module.gpu_memory(index, 1)
    except Exception:  # a query torch-directml documents loosely; never fail the program on it
        return 0
    return int(sum(float(tile) for tile in tiles) * 2**20)


def _device_module(backend: str) -> Any:
    if backend == "sim":
        from dmlpatch.sim.device_module import SimModule

        return SimModule
    if backend == "directml":
        from dmlpatch.devices import directml

        return directml.probe().module
    return None


def _registry_memory(name: str) -> Optional[int]:
    if sys.platform != "win32":
        return None
    try:
        import winreg
    except ImportError:
        return None
    try:
        root = winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, _DISPLAY_CLASS)
    except OSError:
        return None
    with root:
        index = 0
        while True:
            try:
                subkey = winreg.EnumKey(root, index)
            except OSError:
                return None  # no more adapters
            index += 1
            if not subkey.isdigit():
                continue  # "Properties" and the like
            size = _adapter_memory(winreg, root, subkey, name)
            if size is not None:
                return size


def _adapter_memory(winreg: Any, root: Any, subkey: str, name: str) -> Optional[int]:
    try:
        with winreg.OpenKey(root, subkey) as key:
            if str(winreg.QueryValueEx(key, "DriverDesc")[0]).strip() != name.strip():
                return None
            for value_name in _MEMORY_VALUES:
                try:
                    value = winreg.QueryValueEx(key, value_name)[0]
                except OSError:
                    continue
                if isinstance(value, bytes):
                    value = int.from_bytes(value[:8], "little")
                if isinstance(value, int) and value > 0:
                    return value
    except OSError:
        return None
    return None


#: The driver the simulated device says its adapters run (its cost model is its driver).
SIMULATED_DRIVER = "simulated"


def driver_version(backend: str, name: str) -> str:
    """The display driver's version of the adapter called ``name`` (the registry's
    ``DriverVersion``, beside its name), ``"simulated"`` on the simulated device, ``"unknown"``
    where it cannot be read (WSL2, another platform)."""
    if backend == "sim":
        return SIMULATED_DRIVER
    if backend != "directml" or sys.platform != "win32":
        return "unknown"
    try:
        import winreg
    except ImportError:
        return "unknown"
    try:
        root = winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, _DISPLAY_CLASS)
    except OSError:
        return "unknown"
    with root:
        index = 0
        while True:
            try:
                subkey = winreg.EnumKey(root, index)
            except OSError:
                return "unknown"
            index += 1
            if not subkey.isdigit():
                continue
            try:
                with winreg.OpenKey(root, subkey) as key:
                    if str(winreg.QueryValueEx(key, "DriverDesc")[0]).strip() != name.strip():
                        continue
                    return str(winreg.QueryValueEx(key, "DriverVersion")[0]).strip() or "unknown"
            except OSError:
                continue
