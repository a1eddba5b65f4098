"""Antialiased and exact-nearest resizing on the simulated device: dmlpatch's composition
(:mod:`dmlpatch.opfix.vision.resizing`) against DirectML's CPU fallback it replaces, measured
side by side in one run, with what each costs on a GPU.

    python benchmarks/resizing.py [--repeat N]

For each case it prints, per call on a size seen before: the device kernels launched and the
read-backs (a copy to the host drains DirectML's queue) of each path, the bytes the fallback
copies each way, the simulator's wall time of each, and the time each would take on DirectML
from published figures: a dependent dispatch recorded in a batch costs 2.2-4.6 µs of CPU plus
about 2.25 µs of GPU (DirectML's DxDispatch guide), a synchronising read-back 120 µs on an
Intel Arc (torch-xpu-ops #2157), a host<->device copy its bytes at 16 GB/s (PCIe 4.0 x16 in
practice, an assumption); the composition's memory traffic at the adapter's bandwidth (512 GB/s
for a Radeon RX 6800, 68 GB/s for Intel Iris Xe's shared DDR4-4266, the vendors' figures),
and the fallback's CPU resize as this machine runs it (its kernel timed alone).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F

import dmlpatch.sim as sim
from dmlpatch import opfix
from dmlpatch.environment_variables import DMLPATCH_DEVICE_OPS
from dmlpatch.opfix.vision import resizing

PROFILE = "torch-directml-0.2.5"
LAUNCH_S = (2.2e-6 + 2.25e-6, 4.6e-6 + 2.25e-6)
READ_BACK_S = 120e-6
BYTES_PER_S = 16e9
#: Device memory bandwidth: a desktop RDNA2 card, an Intel integrated GPU.
ADAPTERS = {"RX 6800": 512e9, "Iris Xe": 68e9}
#: Not kernels: views and the allocator.
FREE = {"aten::view", "aten::empty_strided", "aten::empty.memory_format", "aten::resize_"}


def _median_us(call: Callable[[], Any], repeat: int) -> float:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _counted(call: Callable[[], Any]) -> tuple[int, int, int]:
    """Kernels launched, read-backs, and bytes copied between host and device by one call."""
    call()
    sim.reset_counters()
    call()
    counters = sim.counters()
    native = counters["ops"]["native"]
    kernels = sum(n for op, n in native.items() if op not in FREE and op != "aten::_copy_from")
    # Transfers the program asked for, and the copies fallbacks made on its behalf.
    copied = sum(t["bytes"] for t in counters["transfers"].values())
    copied += sum(c["bytes"] for c in counters["copies"].values())
    fallbacks = sum(counters["ops"]["fallback"].values())
    # A fallback call copies its arguments down first: one drain of the queue each.
    return kernels + fallbacks, counters["syncs"] + fallbacks, copied


def _device_bytes(image: torch.Tensor, how: dict[str, Any]) -> int:
    """Bytes the composition's kernels read and write: per resized dimension a gather of
    ``K`` taps per output position, their product with the weights, and the sum over taps
    (about ``5 K + 1`` output-sized passes); exact nearest is one gather."""
    shape = list(image.shape)
    size = image.element_size()
    moved = 0
    for dim, out in ((3, how["size"][1]), (2, how["size"][0])):
        if how["mode"] == "nearest-exact":
            passes = 2
        else:
            indices, _ = resizing._band(how["mode"], shape[dim], out, False, None)
            passes = 5 * indices.shape[1] + 1
        shape[dim] = out
        moved += passes * size * int(torch.tensor(shape).prod())
    return moved


def _composed_us(kernels: int, moved: int, bandwidth: float) -> float:
    return (kernels * LAUNCH_S[1] + moved / bandwidth) * 1e6


def _fallback_us(copied: int, cpu_s: float) -> float:
    return (LAUNCH_S[1] + READ_BACK_S + copied / BYTES_PER_S + cpu_s) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    # The device's column is the composition's, whatever the cost model would pick per call.
    os.environ.setdefault(DMLPATCH_DEVICE_OPS, "all")
    sim.load(PROFILE)
    dev = sim.device(0)
    cases: dict[str, tuple[torch.Tensor, dict[str, Any]]] = {
        "v2.Resize 256->224, batch 8, aa bilinear": (
            torch.rand(8, 3, 256, 256),
            {"size": (224, 224), "mode": "bilinear", "antialias": True},
        ),
        "1024->256, batch 2, aa bicubic": (
            torch.rand(2, 3, 1024, 1024),
            {"size": (256, 256), "mode": "bicubic", "antialias": True},
        ),
        "64->224, batch 16, aa bilinear": (
            torch.rand(16, 3, 64, 64),
            {"size": (224, 224), "mode": "bilinear", "antialias": True},
        ),
        "8x8->5x5, one image, aa bilinear": (
            torch.rand(1, 3, 8, 8),
            {"size": (5, 5), "mode": "bilinear", "antialias": True},
        ),
        "nearest-exact 128->320, batch 8": (
            torch.rand(8, 3, 128, 128),
            {"size": (320, 320), "mode": "nearest-exact"},
        ),
    }
    names = " ".join(f"{n + ' µs':>12}" for n in ADAPTERS)
    print(
        f"{'case':45} {'path':9} {'kernels':>7} {'syncs':>5} {'MB copied':>9} {'MB moved':>9}"
        f" {'sim µs':>9} {names}"
    )
    for name, (image, how) in cases.items():
        x = image.to(dev)

        def call(x: torch.Tensor = x, how: dict[str, Any] = how) -> torch.Tensor:
            return F.interpolate(x, **how)

        cpu_s = _median_us(functools.partial(F.interpolate, image, **how), args.repeat) / 1e6
        opfix.uninstall()
        opfix.install("sim", PROFILE)
        kernels, syncs, copied = _counted(call)
        moved = _device_bytes(image, how)
        wall = _median_us(call, args.repeat)
        modelled = " ".join(f"{_composed_us(kernels, moved, bw):12.0f}" for bw in ADAPTERS.values())
        print(
            f"{name:45} {'composed':9} {kernels:7d} {syncs:5d} {copied / 1e6:9.2f}"
            f" {moved / 1e6:9.1f} {wall:9.0f} {modelled}"
        )
        opfix.uninstall()
        kernels, syncs, copied = _counted(call)
        wall = _median_us(call, args.repeat)
        modelled = " ".join(f"{_fallback_us(copied, cpu_s):12.0f}" for _ in ADAPTERS)
        print(
            f"{'':45} {'fallback':9} {kernels:7d} {syncs:5d} {copied / 1e6:9.2f}"
            f" {0.0:9.1f} {wall:9.0f} {modelled}"
        )


if __name__ == "__main__":
    main()
