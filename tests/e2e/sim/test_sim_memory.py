"""The simulated allocator counts the bytes it holds, per adapter, and the true peak.

Each figure is the sum of the live storages' sizes, exact to the byte: whatever else the session
holds on the device is taken as the baseline. A CPU fallback's results and convolutions (which
the simulator runs on the CPU and adopts) are held like any allocation, as DirectML copies them
into allocations of its own.
"""

from __future__ import annotations

import threading

import torch
from tests.e2e.sim.helpers import REPO_PATH, run_json

import dmlpatch.sim as sim
from dmlpatch.devices import adapters
from dmlpatch.runtime import memory_peaks
from dmlpatch.sim.device_module import SimModule

MB = 2**20


def test_an_allocation_is_held_to_the_byte_until_freed(dev: torch.device) -> None:
    before = sim.memory_allocated()
    x = torch.empty(2 * MB, device=dev)  # 8 MB of float32
    assert sim.memory_allocated() - before == 8 * MB
    odd = torch.empty(3, dtype=torch.int16, device=dev)
    assert sim.memory_allocated() - before == 8 * MB + 6
    del x, odd
    assert sim.memory_allocated() == before


def test_the_peak_is_the_true_one_though_nobody_asked_then(dev: torch.device) -> None:
    sim.reset_peak_memory()
    before = sim.memory_allocated()
    assert sim.max_memory_allocated() == before

    def burst() -> None:
        y = torch.empty(8 * MB, device=dev)  # 32 MB, freed on return
        y.fill_(1.0)

    burst()
    assert sim.memory_allocated() == before
    assert sim.max_memory_allocated() == before + 32 * MB
    sim.reset_peak_memory()
    assert sim.max_memory_allocated() == before


def test_results_made_on_the_cpu_are_held_by_the_device(dev: torch.device) -> None:
    a, b = torch.randn(1000, device=dev), torch.randn(1000, device=dev)
    x, w = torch.randn(1, 3, 16, 16, device=dev), torch.randn(4, 3, 3, 3, device=dev)
    before = sim.memory_allocated()
    lerped = torch.lerp(a, b, 0.5)  # a fallback in torch-directml 0.2.5
    grown = torch.empty(0, device=dev)
    torch.lerp(a, b, 0.5, out=grown)  # the CPU kernel grows the out= tensor
    convolved = torch.nn.functional.conv2d(x, w)  # run on the CPU, adopted
    assert sim.memory_allocated() - before == 4000 + 4000 + 4 * 14 * 14 * 4
    del lerped, grown, convolved
    assert sim.memory_allocated() == before


def test_threads_and_autograd_s_device_thread_keep_the_count(dev: torch.device) -> None:
    before = sim.memory_allocated()

    def churn() -> None:
        for _ in range(500):
            t = torch.empty(1000, device=dev)
            (t + 1).sum()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sim.memory_allocated() == before
    weight = torch.randn(256, 256, device=dev, requires_grad=True)
    (weight @ weight).sum().backward()  # the gradient is made on autograd's device thread
    assert sim.memory_allocated() - before == 2 * 256 * 256 * 4
    del weight
    assert sim.memory_allocated() == before


def test_gpu_memory_reports_the_held_bytes_in_tiles(dev: torch.device) -> None:
    held = sim.memory_allocated()
    x = torch.empty(5 * MB // 4 + 1, device=dev)  # 5 MB and 4 bytes
    tiles = SimModule.gpu_memory(0, 1)
    assert sum(tiles) * MB == held + 5 * MB + 4
    assert all(tile == 1.0 for tile in tiles[:-1]) and 0 < tiles[-1] <= 1.0
    assert sum(SimModule.gpu_memory(0, 4)) * MB == held + 5 * MB + 4
    assert adapters.memory_in_use("sim", 0) == held + 5 * MB + 4
    del x


def test_steps_are_sampled_for_a_peak_that_reads_gpu_memory(dev: torch.device) -> None:
    """DirectML's peak (the highest gpu_memory reading), here read from the simulated one: the
    optimizer step is sampled, though the program asks only afterwards."""
    model = torch.nn.Linear(64, 64).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    memory_peaks.sample_at_steps("sim", (0,))
    try:
        memory_peaks.reset_sampled_peak("sim", 0)
        held = torch.empty(8 * MB, device=dev)  # 32 MB, held across the step only
        model(torch.randn(16, 64, device=dev)).sum().backward()
        optimizer.step()
        at_step = sim.memory_allocated()
        del held
        after = sim.memory_allocated()
        assert memory_peaks.sampled_peak("sim", 0) == at_step >= after + 32 * MB
    finally:
        memory_peaks._stop_sampling()
    memory_peaks.reset_sampled_peak("sim", 0)
    optimizer.step()  # no longer sampled
    assert memory_peaks.sampled_peak("sim", 0) == after


_TWO_ADAPTERS = """
import json, torch, dmlpatch.sim as sim
sim.load()
zero, one = sim.device(0), sim.device(1)
base = [sim.memory_allocated(0), sim.memory_allocated(1)]
x = torch.empty(2 * 2**20, device=one)
y = torch.empty(2**20, device=zero)
held = [sim.memory_allocated(0) - base[0], sim.memory_allocated(1) - base[1]]
moved = x.to(zero)
after_move = [sim.memory_allocated(0) - base[0], sim.memory_allocated(1) - base[1]]
del x, moved, y
sim.reset_peak_memory(0)
peaks = [sim.max_memory_allocated(0) - base[0], sim.max_memory_allocated(1) - base[1]]
try:
    sim.memory_allocated(2)
    beyond = "answered"
except Exception as error:
    beyond = type(error).__name__
print(json.dumps({"held": held, "after_move": after_move, "peaks": peaks, "beyond": beyond,
                  "now": [sim.memory_allocated(0) - base[0], sim.memory_allocated(1) - base[1]]}))
"""


def test_each_adapter_counts_its_own() -> None:
    out = run_json(_TWO_ADAPTERS, DMLPATCH_SIM_DEVICES="2", PYTHONPATH=REPO_PATH)
    assert out["held"] == [4 * MB, 8 * MB]
    assert out["after_move"] == [12 * MB, 8 * MB]
    assert out["peaks"] == [0, 8 * MB]  # adapter 0 reset; adapter 1 kept its own
    assert out["now"] == [0, 0]
    assert out["beyond"] == "DeviceUnavailable"
