"""Which GPU family a DirectML adapter is, from the name DirectML reports, and whether a faster
route than DirectML serves it.

DirectML is frozen (maintenance mode since July 2025), and for some adapters it is no longer
the fastest way to run PyTorch on Windows: AMD ships PyTorch wheels for Windows on ROCm for its
RDNA GPUs, and PyTorch's XPU build (``torch.xpu``) runs Intel Arc and Core Ultra graphics
natively; a CUDA build serves NVIDIA GPUs its kernels cover (``auto`` already prefers such a
GPU). For the rest (AMD Polaris, Vega and older GCN, Intel's UHD/HD/Iris Xe graphics, Qualcomm
Adreno) DirectML is the path. ``dmlpatch doctor`` says one line per adapter.

Names are matched as DirectML (the Windows display driver) writes them: ``AMD Radeon RX
6600``, ``Intel(R) Arc(TM) A770 Graphics``, ``NVIDIA GeForce GT 645M``.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

_ROCM = (
    "AMD ships PyTorch wheels for Windows on ROCm for RDNA GPUs, faster than DirectML: "
    "https://rocm.docs.amd.com (PyTorch on Windows: the GPUs it lists)"
)
_XPU = (
    "PyTorch's XPU build runs Intel Arc and Core Ultra graphics natively, faster than DirectML: "
    "pip install torch --index-url https://download.pytorch.org/whl/xpu, then --device xpu"
)
_CUDA = (
    "a CUDA build of PyTorch is faster where it has kernels for this GPU (`auto` checks its "
    "compute capability and uses CUDA then); DirectML is the path for GPUs it no longer covers"
)
_DIRECTML = "DirectML is the path for this GPU (no ROCm, XPU or CUDA build of PyTorch serves it)"


class Family(NamedTuple):
    name: str  # e.g. "AMD RDNA 2"
    advice: str  # one clause: the faster route and where, or that DirectML is the path
    faster: Optional[str]  # the faster backend ("rocm", "xpu", "cuda"), None: DirectML


def _amd(name: str) -> Optional[Family]:
    model = re.search(r"\bRX\s*(\d{3,4})\b", name)
    if model:
        number = int(model.group(1))
        if 5000 <= number < 10000:
            generation = {5: 1, 6: 2, 7: 3, 9: 4}.get(number // 1000)
            if generation is not None:
                return Family(f"AMD RDNA {generation}", _ROCM, "rocm")
        if 400 <= number < 600:
            return Family("AMD Polaris", _DIRECTML, None)
    workstation = re.search(r"\bPRO\s*W(\d{4})\b", name, re.IGNORECASE)
    if workstation:
        generation = {5: 1, 6: 2, 7: 3, 9: 4}.get(int(workstation.group(1)) // 1000)
        if generation is not None:
            return Family(f"AMD RDNA {generation} (Radeon PRO)", _ROCM, "rocm")
    integrated = re.search(r"\bRadeon\s*(?:\(TM\)\s*)?(\d{3,4})([MS])\b", name)
    if integrated:
        # Ryzen graphics: 610M-680M are RDNA 2, 740M-780M RDNA 3, 880M/890M/8060S RDNA 3.5.
        number = int(integrated.group(1))
        release = "2" if number < 700 else "3" if number < 800 else "3.5"
        return Family(f"AMD RDNA {release} (integrated)", _ROCM, "rocm")
    if "VEGA" in name.upper() or "RADEON VII" in name.upper():
        return Family("AMD Vega", _DIRECTML, None)
    if re.search(r"\b(R[579]\s*\d{3}|HD\s*[78]\d{3}|FURY|NANO)\b", name, re.IGNORECASE):
        return Family("AMD GCN", _DIRECTML, None)
    return None


def _intel(name: str) -> Optional[Family]:
    upper = name.upper()
    if "ARC" in upper:
        return Family("Intel Arc", _XPU, "xpu")
    if re.search(r"\b(UHD|HD|IRIS)\b", upper):
        return Family("Intel integrated graphics (before Arc)", _DIRECTML, None)
    return None


def family(name: str) -> Optional[Family]:
    """The family of the adapter DirectML calls ``name``; None where the name says too little."""
    upper = name.upper()
    if "MICROSOFT BASIC RENDER" in upper:
        return Family(
            "no GPU (Microsoft Basic Render Driver)",
            "a software renderer on the CPU, slower than plain PyTorch on the CPU: install the "
            "GPU's own driver",
            None,
        )
    if "RADEON" in upper or upper.startswith("AMD"):
        return _amd(name)
    if "INTEL" in upper:
        return _intel(name)
    if "NVIDIA" in upper or "GEFORCE" in upper or "QUADRO" in upper:
        return Family("NVIDIA", _CUDA, "cuda")
    if "ADRENO" in upper or "QUALCOMM" in upper:
        return Family("Qualcomm Adreno", _DIRECTML, None)
    return None


def advice(name: str) -> str:
    """One line for the adapter DirectML calls ``name``."""
    found = family(name)
    if found is None:
        return f"{name}: no advice for this adapter (its name does not say its GPU family)"
    return f"{name} ({found.name}): {found.advice}"
