"""What the dtype wall's fixes cost on the simulated device: STFTs at whisper's and Demucs'
sizes and rfft/irfft round trips of 2**10 to 2**16 points, each on the device (dmlpatch's
matrix-product transforms) against the way a DirectML user works around the missing complex
type (``.cpu()``, transform there, ``.to(device)`` back: two copies), and against the CPU; and
the bfloat16 policy's cost at load time (a bfloat16 checkpoint onto the device against the
same weights saved in float32).

    python benchmarks/spectral.py [--repeat N]

The simulated device runs the CPU's kernels, so the times compare code paths: on the CPU a
matrix-product DFT does more arithmetic than pocketfft's FFT, and the host path's copies are
memcpys. On a GPU the products are what it does fastest and each copy waits for its queue.
Copies per call come from the simulator's counters (after the first call, which uploads a
length's matrices once).
"""

from __future__ import annotations

import argparse
import io
import time
from typing import Any, Callable

import torch

import dmlpatch.sim as sim
from dmlpatch import opfix

PROFILE = "torch-directml-0.2.5"


def _time(call: Callable[[], Any], repeat: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat * 1e3


def _copies(call: Callable[[], Any]) -> int:
    call()
    sim.reset_counters()
    call()
    counters = sim.counters()
    return sum(v["count"] for v in counters["transfers"].values())


def _row(
    label: str,
    on_device: Callable[[], Any],
    via_host: Callable[[], Any],
    on_cpu: Callable[[], Any],
    repeat: int,
) -> None:
    device_ms = _time(on_device, repeat)
    host_ms = _time(via_host, repeat)
    cpu_ms = _time(on_cpu, repeat)
    print(
        f"{label:34} {device_ms:9.2f} {host_ms:9.2f} {cpu_ms:8.2f} "
        f"{_copies(on_device):>6} vs {_copies(via_host):<3}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    sim.load(PROFILE)
    dev = sim.device()
    opfix.install("sim", PROFILE)
    torch.manual_seed(0)
    print(f"{'spectral op':34} {'device ms':>9} {'host ms':>9} {'cpu ms':>8} {'copies/call':>11}")
    _stft_row(
        "stft |.| whisper (30 s, n_fft 400)", torch.randn(1, 16000 * 30), 400, 160, dev, repeat
    )
    _stft_row(
        "stft |.| demucs (7.8 s stereo, 4096)", torch.randn(2, 343980), 4096, 1024, dev, repeat
    )
    for power in range(10, 17, 2):
        _fft_row(power, dev, repeat)
    _load_rows(dev, repeat)


def _stft_row(
    label: str, audio: torch.Tensor, n_fft: int, hop: int, dev: torch.device, repeat: int
) -> None:
    window = torch.hann_window(n_fft)
    on_device, window_on_device = audio.to(dev), window.to(dev)

    def spectrogram(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.stft(x, n_fft, hop, window=w, return_complex=True).abs()

    _row(
        label,
        lambda: spectrogram(on_device, window_on_device),
        lambda: spectrogram(on_device.cpu(), window).to(dev),
        lambda: spectrogram(audio, window),
        repeat,
    )


def _fft_row(power: int, dev: torch.device, repeat: int) -> None:
    n = 1 << power
    signal = torch.randn(8, n)
    on_device = signal.to(dev)

    def round_trip(x: torch.Tensor) -> torch.Tensor:
        return torch.fft.irfft(torch.fft.rfft(x) * 0.5, n)

    _row(
        f"irfft(rfft(x)) of 8 x 2**{power}",
        lambda: round_trip(on_device),
        lambda: round_trip(on_device.cpu()).to(dev),
        lambda: round_trip(signal),
        repeat,
    )


def _load_rows(dev: torch.device, repeat: int) -> None:
    """A 64 MB float32 model's weights, saved in bfloat16 (32 MB) and in float32, loaded onto
    the device with torch.load(map_location=device) and with .to(device)."""
    torch.manual_seed(0)
    weights = {f"layer{i}": torch.randn(1024, 1024) for i in range(16)}
    saved = {}
    for dtype in (torch.float32, torch.bfloat16):
        buffer = io.BytesIO()
        torch.save({k: v.to(dtype) for k, v in weights.items()}, buffer)
        saved[dtype] = buffer.getvalue()

    def load(dtype: torch.dtype, mapped: bool) -> Any:
        buffer = io.BytesIO(saved[dtype])
        if mapped:
            return torch.load(buffer, map_location=dev)
        return {k: v.to(dev) for k, v in torch.load(buffer).items()}

    print(f"\n{'load 64 MB of weights':34} {'bf16 ms':>9} {'f32 ms':>9} {'ratio':>8}")
    for mapped, label in (
        (True, "torch.load(map_location=device)"),
        (False, "torch.load, .to(device)"),
    ):
        bf16 = _time(lambda mapped=mapped: load(torch.bfloat16, mapped), repeat)
        f32 = _time(lambda mapped=mapped: load(torch.float32, mapped), repeat)
        print(f"{label:34} {bf16:9.1f} {f32:9.1f} {bf16 / f32:7.2f}x")


if __name__ == "__main__":
    main()
