"""torch-directml, loaded lazily and defensively.

``import torch_directml`` fails in several ways that users meet in the wild (see the README's
"DirectML unavailable" table); each becomes one line saying why, never a traceback.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

_UNDEFINED_SYMBOL = "undefined symbol"
_NOT_INSTALLED = "torch-directml is not installed (pip install torch-directml; Windows or WSL2)"


@dataclass(frozen=True)
class DirectML:
    """What torch-directml can give this process."""

    available: bool
    reason: str
    names: tuple[str, ...] = ()
    module: Optional[Any] = field(default=None, repr=False, compare=False)


_probed: Optional[DirectML] = None


def probe() -> DirectML:
    """Import torch-directml once and list its adapters; never raises."""
    global _probed
    if _probed is None:
        _probed = _probe()
    return _probed


def precheck() -> Optional[str]:
    """Why torch-directml cannot work here, as far as that shows without importing it (and
    torch); None when only importing it can tell."""
    import importlib.util

    if importlib.util.find_spec("torch_directml") is None:
        return _NOT_INSTALLED
    # Without /dev/dxg it fails too, but an import failure (the torch pin, a missing D3D12
    # library) says more: that waits for the import.
    return None


def _probe() -> DirectML:
    sim = sys.modules.get("dmlpatch.sim")
    if sim is not None and sim.is_loaded():
        return DirectML(
            False,
            "the simulated DirectML device already owns the privateuseone backend in this process",
        )
    try:
        import torch_directml
    except ModuleNotFoundError as error:
        if error.name != "torch_directml":
            return DirectML(False, f"torch-directml failed to import: {_first_line(error)}")
        return DirectML(False, _NOT_INSTALLED)
    except OSError as error:
        return DirectML(
            False,
            f"torch-directml cannot load its native library ({_first_line(error)}); "
            "DirectML works only on Windows and WSL2",
        )
    except ImportError as error:
        if _UNDEFINED_SYMBOL in str(error):
            return DirectML(False, _pin_mismatch())
        return DirectML(False, f"torch-directml failed to import: {_first_line(error)}")
    except Exception as error:  # a third-party import can raise anything; report, don't crash
        return DirectML(False, f"torch-directml failed to import: {_describe(error)}")
    if (
        sys.platform.startswith("linux")
        and "torch_directml_native" in sys.modules
        and not os.path.exists("/dev/dxg")
    ):
        # Outside WSL2 the D3D12 libraries it loads answer from uninitialised memory: queries
        # fail with "Unknown error -NNN" or crash the process (SIGSEGV), so none is made.
        return DirectML(
            False,
            "torch-directml found no /dev/dxg (WSL2's GPU device); "
            "DirectML works only on Windows and WSL2",
            module=torch_directml,
        )
    try:
        if not torch_directml.is_available():
            return DirectML(
                False, "torch-directml reports no DirectML adapter", module=torch_directml
            )
        count = int(torch_directml.device_count())
        names = tuple(str(torch_directml.device_name(i)) for i in range(count))
    except Exception as error:  # documented never to throw, yet raises "Unknown error -NNN"
        return DirectML(
            False,
            f"torch-directml could not query adapters: {_describe(error)}",
            module=torch_directml,
        )
    if not names:
        return DirectML(False, "torch-directml reports no DirectML adapter", module=torch_directml)
    return DirectML(True, f"{len(names)} DirectML adapter(s)", names, torch_directml)


def _pin_mismatch() -> str:
    """torch-directml pins torch exactly; name both versions and the command that fixes it."""
    from dmlpatch._metadata import requirement_of, version_of

    torch_version = version_of("torch") or "unknown"
    pinned = requirement_of("torch-directml", "torch") or "its pinned version"
    fix = " ".join(
        r
        for r in (
            requirement_of("torch-directml", "torch"),
            requirement_of("torch-directml", "torchvision"),
        )
        if r
    )
    suffix = f"; fix: pip install {fix}" if fix else ""
    return (
        f"torch-directml was built for {pinned} but torch {torch_version} is installed "
        f"(undefined symbol){suffix}"
    )


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {_first_line(error)}"
