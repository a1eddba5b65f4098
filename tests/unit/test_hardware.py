"""DirectML adapter names to GPU families, and the route doctor advises for each."""

from __future__ import annotations

import pytest

from dmlpatch.devices import hardware

# (the name DirectML reports, its family, the faster backend or None where DirectML is the path)
NAMES = [
    ("AMD Radeon RX 5700 XT", "AMD RDNA 1", "rocm"),
    ("AMD Radeon RX 6600", "AMD RDNA 2", "rocm"),
    ("AMD Radeon RX 7900 XTX", "AMD RDNA 3", "rocm"),
    ("AMD Radeon RX 9070 XT", "AMD RDNA 4", "rocm"),
    ("AMD Radeon Pro W6800", "AMD RDNA 2 (Radeon PRO)", "rocm"),
    ("AMD Radeon 780M Graphics", "AMD RDNA 3 (integrated)", "rocm"),
    ("AMD Radeon(TM) 8060S Graphics", "AMD RDNA 3.5 (integrated)", "rocm"),
    ("Radeon RX 580 Series", "AMD Polaris", None),
    ("AMD Radeon RX 480", "AMD Polaris", None),
    ("Radeon RX Vega 56", "AMD Vega", None),
    ("AMD Radeon(TM) Vega 8 Graphics", "AMD Vega", None),
    ("AMD Radeon VII", "AMD Vega", None),
    ("AMD Radeon R9 390", "AMD GCN", None),
    ("AMD Radeon HD 7970", "AMD GCN", None),
    ("Intel(R) Arc(TM) A770 Graphics", "Intel Arc", "xpu"),
    ("Intel(R) Arc(TM) Graphics", "Intel Arc", "xpu"),  # Core Ultra (Meteor Lake)
    ("Intel(R) Arc(TM) 140V GPU (16GB)", "Intel Arc", "xpu"),  # Core Ultra (Lunar Lake)
    ("Intel(R) UHD Graphics 630", "Intel integrated graphics (before Arc)", None),
    ("Intel(R) Iris(R) Xe Graphics", "Intel integrated graphics (before Arc)", None),
    ("Intel(R) HD Graphics 520", "Intel integrated graphics (before Arc)", None),
    ("NVIDIA GeForce GT 645M", "NVIDIA", "cuda"),
    ("Qualcomm(R) Adreno(TM) X1-85 GPU", "Qualcomm Adreno", None),
    ("Microsoft Basic Render Driver", "no GPU (Microsoft Basic Render Driver)", None),
]


@pytest.mark.parametrize(("name", "family", "faster"), NAMES)
def test_families_and_routes(name: str, family: str, faster: object) -> None:
    found = hardware.family(name)
    assert found is not None and (found.name, found.faster) == (family, faster)
    line = hardware.advice(name)
    assert line.startswith(f"{name} ({family}): ")
    if faster == "rocm":
        assert "ROCm" in line and "https://rocm.docs.amd.com" in line
    elif faster == "xpu":
        assert "download.pytorch.org/whl/xpu" in line and "--device xpu" in line
    elif family.startswith(("AMD", "Intel", "Qualcomm")):
        assert "DirectML is the path" in line


def test_names_that_say_too_little() -> None:
    for name in ("AMD Radeon(TM) Graphics", "Simulated Radeon (discrete)", "Some GPU"):
        assert hardware.family(name) is None
        assert hardware.advice(name).endswith(
            "no advice for this adapter (its name does not say its GPU family)"
        )
