"""Measuring an adapter's cost-model constants (``dmlpatch calibrate``).

Each constant is the slope between two runs that differ only in what it prices, so that
whatever both runs share (the read-back that waits for the queue at the end of each, Python's
own time) cancels:

- **launch**: N and 2N one-element additions;
- **read-back**: N and 2N (one-element addition, ``.item()``) pairs, less a launch each;
- **download / upload**: 16 MB and 64 MB copied to the host / to the device;
- **memory bandwidth**: ``torch.add(a, b, out=c)`` over 4 M and 16 M floats (three tensors of
  traffic), per call;
- **float32 / float16 rate**: N and 2N products of 1024x1024 (float32) and 512x512 (float16)
  matrices, less a launch each (sizes at which every shipped adapter is bound by arithmetic);
- **host call and rate**: the CPU's own ``torch.linalg.solve`` of 4x4 and 384x384 matrices (what
  a CPU fallback's kernel costs on this host).

On real DirectML the clock is the wall clock, each run ending with a read-back so that the GPU
has finished; on the simulated device it is the cost model's own clock, so calibrating a
simulated adapter recovers the profile it is configured as (the test of this module), except
the host figures, which are this machine's wherever it runs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, NamedTuple, Optional

from dmlpatch.costs import profiles

#: Repetitions of each measurement; the median is kept (the wall clock is noisy).
ROUNDS = 3


class Clock(NamedTuple):
    """Seconds of device time so far; ``rounds``: repetitions of each measurement, whose median
    is kept (a wall clock is noisy, a modelled one exact)."""

    now: Callable[[], float]
    name: str
    rounds: int = 1


def wall_clock() -> Clock:
    return Clock(time.perf_counter, "the wall clock (real adapter)", ROUNDS)


def modelled_clock() -> Clock:
    """The simulated device's modelled time, on the profile it is configured as."""
    from dmlpatch.costs import simulated

    return Clock(simulated.seconds, "the cost model's clock (simulated adapter)")


def _run(clock: Clock, sink: Any, work: Callable[[], None]) -> float:
    """Seconds ``work`` takes on ``clock``, its device work finished by one read-back."""
    start = clock.now()
    work()
    float(sink.sum().item())  # waits for the queue: the same in both runs of a slope
    return clock.now() - start


def _slope(clock: Clock, sink: Any, once: Callable[[], None], count: int) -> float:
    """Seconds per ``once``: runs of ``count`` and ``2 * count``, differenced (the median of the
    clock's rounds)."""

    def repeat(times: int) -> Callable[[], None]:
        def work() -> None:
            for _ in range(times):
                once()

        return work

    estimates = []
    for _ in range(clock.rounds):
        single = _run(clock, sink, repeat(count))
        double = _run(clock, sink, repeat(2 * count))
        estimates.append((double - single) / count)
    return statistics.median(estimates)


def _size_slope(
    clock: Clock, sink: Any, small: Callable[[], None], large: Callable[[], None]
) -> float:
    estimates = []
    for _ in range(clock.rounds):
        estimates.append(_run(clock, sink, large) - _run(clock, sink, small))
    return statistics.median(estimates)


class Measured(NamedTuple):
    profile: profiles.Profile
    #: Figure -> how it was measured, in words.
    how: dict[str, str]


def measure(device: Any, clock: Clock, adapter: str, name: str = "measured") -> Measured:
    """Every figure of a profile, measured on ``device`` with ``clock``."""
    import torch

    sink = torch.zeros(1, device=device)
    one = torch.zeros(1, device=device)
    sink.add_(1)
    float(sink.item())

    launch = _slope(clock, sink, lambda: one.add_(1), 200)

    def add_and_read() -> None:
        one.add_(1)
        float(one.item())

    readback = _slope(clock, sink, add_and_read, 50) - launch

    small_bytes, large_bytes = 16 * 2**20, 64 * 2**20
    on_device = {n: torch.zeros(n // 4, device=device) for n in (small_bytes, large_bytes)}
    on_host = {n: torch.zeros(n // 4) for n in (small_bytes, large_bytes)}
    extra = large_bytes - small_bytes
    download_s = _size_slope(
        clock, sink, lambda: on_device[small_bytes].cpu(), lambda: on_device[large_bytes].cpu()
    )
    upload_s = _size_slope(
        clock,
        sink,
        lambda: on_host[small_bytes].to(device),
        lambda: on_host[large_bytes].to(device),
    )

    operands = {}
    for elements in (4 * 2**20, 16 * 2**20):
        a = torch.ones(elements, device=device)
        operands[elements] = (a, torch.ones(elements, device=device), torch.empty_like(a))

    def add(elements: int) -> Callable[[], None]:
        a, b, c = operands[elements]

        def once() -> None:
            torch.add(a, b, out=c)

        return once

    memory_s = _size_slope(clock, sink, add(4 * 2**20), add(16 * 2**20))
    traffic = 3 * 4 * (16 - 4) * 2**20

    rates = {}
    for label, n, dtype in (("float", 1024, torch.float32), ("half", 512, torch.float16)):
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        per_call = _slope(clock, sink, _product(a, b, out), 2)
        rates[label] = 2 * n**3 / max(per_call - launch, 1e-12) / 1e12

    host_call_s, host_gflops = _host_rates()
    figures = {
        "launch_us": launch * 1e6,
        "readback_us": readback * 1e6,
        "upload_gbps": extra / max(upload_s, 1e-12) / 1e9,
        "download_gbps": extra / max(download_s, 1e-12) / 1e9,
        "memory_gbps": traffic / max(memory_s, 1e-12) / 1e9,
        "float_tflops": rates["float"],
        "half_tflops": rates["half"],
        "host_call_us": host_call_s * 1e6,
        "host_gflops": host_gflops,
    }
    how = {
        "launch_us": "one-element additions, 200 against 400",
        "readback_us": "an addition and .item(), 50 against 100 pairs, less a launch each",
        "upload_gbps": "16 MB against 64 MB copied to the device",
        "download_gbps": "16 MB against 64 MB copied to the host",
        "memory_gbps": "torch.add(a, b, out=c) over 4 M against 16 M floats",
        "float_tflops": "1024x1024 float32 products, 2 against 4, less a launch each",
        "half_tflops": "512x512 float16 products, 2 against 4, less a launch each",
        "host_call_us": "torch.linalg.solve of a 4x4 matrix on this host's CPU",
        "host_gflops": "torch.linalg.solve of a 384x384 matrix on this host's CPU",
    }
    sources = {key: f"measured on {adapter} ({clock.name}): {text}" for key, text in how.items()}
    positive = {key: max(value, 1e-9) for key, value in figures.items()}
    return Measured(
        profiles.Profile(name, adapter, sources=sources, shipped=False, **positive), how
    )


def _product(a: Any, b: Any, out: Any) -> Callable[[], None]:
    import torch

    def once() -> None:
        torch.mm(a, b, out=out)

    return once


def _host_rates() -> tuple[float, float]:
    """(seconds of one tiny CPU linear-algebra call, GFLOP/s of a sizeable one)."""
    import torch

    def timed(n: int, repeat: int) -> float:
        a = torch.randn(n, n) + n * torch.eye(n)
        b = torch.randn(n, 1)
        torch.linalg.solve(a, b)
        samples = []
        for _ in range(2 * ROUNDS + 1):  # the wall clock of a shared CPU: more rounds
            start = time.perf_counter()
            for _ in range(repeat):
                torch.linalg.solve(a, b)
            samples.append((time.perf_counter() - start) / repeat)
        return statistics.median(samples)

    call = timed(4, 200)
    large = timed(384, 4)
    flops = 2 / 3 * 384**3 + 2 * 384**2
    return call, flops / max(large - call, 1e-12) / 1e9


class FixCheck(NamedTuple):
    """One fix, both ways, on this adapter: measured, and as the model prices it."""

    label: str
    operator: str
    composition_s: float
    fallback_s: float
    modelled_composition_s: float
    modelled_fallback_s: float

    @property
    def agrees(self) -> bool:
        """Whether the model picks the side that measured faster."""
        measured = self.composition_s <= self.fallback_s
        return measured == (self.modelled_composition_s <= self.modelled_fallback_s)

    def to_json(self) -> dict[str, Any]:
        return {**self._asdict(), "agrees": self.agrees}


class _Probe(NamedTuple):
    label: str
    operator: str
    call: Callable[[], Any]
    #: The operator's arguments as its fix's cost function takes them.
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = {}


def _probes(device: Any) -> list[_Probe]:
    """The linear algebra that fixes compose, each at a size where the choice is close and at
    one where it is not."""
    import torch

    def symmetric(*shape: int) -> Any:
        a = torch.randn(*shape)
        return (a + a.mT).to(device)

    def positive(*shape: int) -> Any:
        a = torch.randn(*shape)
        return (a @ a.mT + shape[-1] * torch.eye(shape[-1])).to(device)

    eigh8, eigh32 = symmetric(8, 8), symmetric(32, 32)
    spd64, batch3 = positive(64, 64), positive(1024, 3, 3)
    rhs3 = torch.randn(1024, 3, 1).to(device)
    lower3 = torch.linalg.cholesky(positive(1024, 3, 3).cpu()).to(device)
    return [
        _Probe("eigh 8x8", "aten::_linalg_eigh", lambda: torch.linalg.eigh(eigh8), (eigh8,)),
        _Probe("eigh 32x32", "aten::_linalg_eigh", lambda: torch.linalg.eigh(eigh32), (eigh32,)),
        _Probe(
            "cholesky 64x64",
            "aten::linalg_cholesky_ex",
            lambda: torch.linalg.cholesky(spd64),
            (spd64,),
        ),
        _Probe(
            "solve_triangular 1024 x 3x3",
            "aten::linalg_solve_triangular",
            lambda: torch.linalg.solve_triangular(lower3, rhs3, upper=False),
            (lower3, rhs3),
            {"upper": False},
        ),
        _Probe(
            "solve 1024 x 3x3",
            "aten::_linalg_solve_ex",
            lambda: torch.linalg.solve(batch3, rhs3),
            (batch3, rhs3),
        ),
    ]


def _cost_function(operator: str) -> Optional[Callable[..., Any]]:
    from dmlpatch.opfix import registry

    for fix in registry.fixes():
        if operator in fix.costs:
            return fix.costs[operator]
    return None


def check_fixes(device: Any, clock: Clock, profile: profiles.Profile) -> list[FixCheck]:
    """Each probe timed through its fix's composition and through DirectML's fallback (every
    chooser forced each way), beside the model's price of both on ``profile``; probes whose
    operator has no cost function here (the fixes are not installed) are left out."""
    import warnings

    from dmlpatch.costs import choice

    sink = device_sink(device)
    found = []
    for probe in _probes(device):
        cost = _cost_function(probe.operator)
        if cost is None:
            continue
        timed = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DirectML's fallback warning, said by the probe
            for on_device in (True, False):
                with choice.forcing(on_device):
                    probe.call()
                    # The least of a few: a fallback's CPU kernel is timed on the wall clock
                    # even on the simulated device, and another process may take the CPU.
                    timed[on_device] = min(
                        _run(clock, sink, probe.call) for _ in range(max(clock.rounds, 3))
                    )
        both = cost(*probe.args, **probe.kwargs)
        found.append(
            FixCheck(
                probe.label,
                probe.operator,
                timed[True],
                timed[False],
                choice.device_seconds(both.device, profile),
                choice.fallback_seconds(both.fallback, profile),
            )
        )
    return found


def device_sink(device: Any) -> Any:
    """A one-element tensor whose read-back ends each timed run."""
    import torch

    return torch.zeros(1, device=device)
