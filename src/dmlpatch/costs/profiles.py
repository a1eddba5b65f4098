"""What a DirectML adapter charges for the things a PyTorch program makes it do: the constants of
the cost model, per adapter, each with where it comes from.

A profile is either shipped (below: one per adapter class DirectML's users have, built from
published figures) or measured on the user's own adapter by ``dmlpatch calibrate``
(:mod:`dmlpatch.costs.machine`). The model (:mod:`dmlpatch.costs.pricing`) charges:

- **launch**: every device kernel, ``launch_us`` (the host's recording and the GPU's dispatch
  of one dependent operator);
- **read-back**: every value the host waits for (``.item()``, ``.cpu()``, a ``nonzero``'s
  count, each argument a CPU fallback copies down), ``readback_us``, because each one drains
  DirectML's queue;
- **copy**: bytes between host and device at ``upload_gbps`` / ``download_gbps``;
- **compute**: each kernel on a roofline: its bytes at ``memory_gbps`` or its FLOPs at
  ``float_tflops`` (``half_tflops`` for float16), whichever is slower;
- **host CPU**: a fallback's CPU kernel; measured where it runs (the simulated device times the
  CPU kernel itself), estimated for a choice not yet made as ``host_call_us`` plus its FLOPs at
  ``host_gflops``.

Rates are what kernels achieve, not the vendors' peaks: a shipped profile takes the vendor's
peak times an assumed fraction, and says so in ``sources``. The model is serial (it adds the
host's and the GPU's time where a real queue overlaps them), so it is an upper bound for
programs the GPU keeps busy and close for programs bound by launches and read-backs, which are
the ones whose choices it decides.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Optional

#: The fields that are figures, in the order a profile file and ``calibrate`` list them.
FIGURES = (
    "launch_us",
    "readback_us",
    "upload_gbps",
    "download_gbps",
    "memory_gbps",
    "float_tflops",
    "half_tflops",
    "host_call_us",
    "host_gflops",
)

_DXDISPATCH = (
    "DirectML's DxDispatch guide (github.com/microsoft/DirectML, DxDispatch/doc/Guide.md): "
    "a dependent dispatch recorded in a batch costs 4.6 µs of CPU and 2.25 µs of GPU (NVIDIA, "
    "D3D12), assumed the same on this adapter; plus PyTorch's own dispatch of one operator "
    "from Python, 2.5 µs (measured on this project's machines: a one-element in-place addition "
    "on the CPU)"
)
#: PyTorch's dispatch of one operator from Python, measured (see _DXDISPATCH).
_TORCH_DISPATCH_US = 2.5
_DISPATCH_AND_WAIT = (
    "DxDispatch guide: one operator dispatched and waited for, warm, 0.13-0.16 ms of CPU time "
    "(NVIDIA, D3D12); the low end, assumed the same on this adapter"
)
_PCIE = (
    "assumed: PCIe 4.0 x16 in practice; tinygrad measured 6-26 GB/s device to host on AMD and "
    "NVIDIA (github.com/tinygrad/tinygrad/pull/12137)"
)
_HOST = (
    "assumed: a desktop CPU's small LAPACK calls (this project's CPU measured 3-11 GFLOP/s on "
    "32x32 to 64x64 decompositions, 10-40 µs each); `dmlpatch calibrate` measures the user's"
)
_FRACTION = 0.5


@dataclasses.dataclass(frozen=True)
class Profile:
    """The cost model's constants for one adapter."""

    name: str
    #: The adapter (class) it describes, in words.
    adapter: str
    launch_us: float
    readback_us: float
    upload_gbps: float
    download_gbps: float
    memory_gbps: float
    float_tflops: float
    half_tflops: float
    host_call_us: float
    host_gflops: float
    #: Where each figure comes from (figure name -> a citation, or "measured ...").
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Shipped with dmlpatch (True) or measured on an adapter (False).
    shipped: bool = True

    def figures(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in FIGURES}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "adapter": self.adapter,
            **self.figures(),
            "sources": dict(self.sources),
        }


def from_json(data: Any) -> Profile:
    """A profile read back from :meth:`Profile.to_json`'s data; ``ValueError`` says what is
    wrong with it (a missing or non-positive figure, a wrong type)."""
    if not isinstance(data, dict):
        raise ValueError("not an object")
    figures: dict[str, float] = {}
    for name in FIGURES:
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} is missing or not a number")
        if not value > 0 or value != value or value == float("inf"):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
        figures[name] = float(value)
    label, adapter = data.get("name"), data.get("adapter")
    if not isinstance(label, str) or not isinstance(adapter, str):
        raise ValueError("name and adapter must be strings")
    sources = data.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ValueError("sources must map figures to strings")
    return Profile(label, adapter, sources=dict(sources), shipped=False, **figures)


def _shipped(
    name: str,
    adapter: str,
    *,
    memory_peak_gbps: float,
    float_peak_tflops: float,
    half_peak_tflops: float,
    vendor: str,
    readback_us: float = 130.0,
    readback_source: str = _DISPATCH_AND_WAIT,
    link_gbps: float = 16.0,
    link_source: str = _PCIE,
) -> Profile:
    share = f"; achieved taken as {_FRACTION:.0%} of it (assumed)"
    return Profile(
        name,
        adapter,
        launch_us=4.6 + 2.25 + _TORCH_DISPATCH_US,
        readback_us=readback_us,
        upload_gbps=link_gbps,
        download_gbps=link_gbps,
        memory_gbps=memory_peak_gbps * _FRACTION,
        float_tflops=float_peak_tflops * _FRACTION,
        half_tflops=half_peak_tflops * _FRACTION,
        host_call_us=10.0,
        host_gflops=10.0,
        sources={
            "launch_us": _DXDISPATCH,
            "readback_us": readback_source,
            "upload_gbps": link_source,
            "download_gbps": link_source,
            "memory_gbps": f"{vendor}: {memory_peak_gbps:g} GB/s peak{share}",
            "float_tflops": f"{vendor}: {float_peak_tflops:g} TFLOP/s float32 peak{share}",
            "half_tflops": f"{vendor}: {half_peak_tflops:g} TFLOP/s float16 peak{share}",
            "host_call_us": _HOST,
            "host_gflops": _HOST,
        },
    )


#: The shipped profiles, by name; the first is the default.
SHIPPED: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        _shipped(
            "rdna2-desktop",
            "a desktop AMD RDNA 2 card (Radeon RX 6800)",
            memory_peak_gbps=512,
            float_peak_tflops=16.2,
            half_peak_tflops=32.3,
            vendor="AMD's Radeon RX 6800 specifications",
        ),
        _shipped(
            "rdna3-desktop",
            "a desktop AMD RDNA 3 card (Radeon RX 7900 XTX)",
            memory_peak_gbps=960,
            float_peak_tflops=61.4,
            half_peak_tflops=122.8,
            vendor="AMD's Radeon RX 7900 XTX specifications",
        ),
        _shipped(
            "intel-igpu",
            "Intel integrated graphics (Iris Xe, 96 EU, on DDR4-4266)",
            memory_peak_gbps=68,
            float_peak_tflops=2.2,
            half_peak_tflops=4.4,
            vendor="Intel's Iris Xe (96 EU at 1.45 GHz) and DDR4-4266 dual-channel figures",
            link_gbps=10.0,
            link_source=(
                "assumed: the GPU shares the host's memory, and a copy is a memcpy through "
                "the driver's staging buffer"
            ),
        ),
        _shipped(
            "intel-arc",
            "an Intel Arc discrete card (Arc A770)",
            memory_peak_gbps=560,
            float_peak_tflops=19.7,
            half_peak_tflops=39.3,
            vendor="Intel's Arc A770 specifications (vector engines; DirectML's use of XMX "
            "is not documented)",
            readback_us=120.0,
            readback_source=(
                "a synchronous 1-byte device-to-host copy on an Intel Arc B580: 120 µs "
                "(github.com/intel/torch-xpu-ops/issues/2157; PyTorch's XPU stack, not DirectML)"
            ),
        ),
    )
}
DEFAULT = "rdna2-desktop"

#: Adapter names (as DirectML and the simulated device write them) to the closest profile.
_BY_NAME = (
    (
        re.compile(r"\bRX\s*7\d{3}\b|\bRadeon\s*(?:\(TM\)\s*)?7\d{2}M\b", re.IGNORECASE),
        "rdna3-desktop",
    ),
    (re.compile(r"\bArc\b", re.IGNORECASE), "intel-arc"),
    (re.compile(r"\b(UHD|Iris|HD Graphics)\b", re.IGNORECASE), "intel-igpu"),
    (re.compile(r"Radeon|AMD|NVIDIA|GeForce|Quadro", re.IGNORECASE), "rdna2-desktop"),
)


def closest(adapter: str) -> tuple[Profile, bool]:
    """The shipped profile closest to the adapter DirectML calls ``adapter``, and whether the
    name said which (False: the default, for a name that says nothing)."""
    for pattern, name in _BY_NAME:
        if pattern.search(adapter):
            return SHIPPED[name], True
    return SHIPPED[DEFAULT], False


def named(name: str) -> Optional[Profile]:
    """The shipped profile ``name``, or None."""
    return SHIPPED.get(name)
