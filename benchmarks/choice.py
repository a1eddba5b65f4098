"""What the per-call choice between a fix's composition and DirectML's fallback costs a call
whose shapes were seen before: a dictionary lookup, and the key the kernel builds for it,
side by side with one device kernel and a whole fixed call on the simulated device.

    python benchmarks/choice.py [--repeat N]

The choice's own figures are the host's, so they hold on DirectML as here; the kernels' are
the simulator's (CPU kernels behind the same dispatch), for scale.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import torch

import dmlpatch.sim as sim
from dmlpatch import opfix
from dmlpatch.costs.choice import Chooser
from dmlpatch.environment_variables import DMLPATCH_DEVICE_OPS
from dmlpatch.opfix.linalg import lu


def _ns(call: Callable[[], Any], repeat: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) / repeat * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20000)
    repeat = parser.parse_args().repeat

    # The fixed call below is the composition's (13 launches), whatever the model picks.
    os.environ[DMLPATCH_DEVICE_OPS] = "aten::linalg_solve_triangular"
    sim.load()
    opfix.install("sim", "torch-directml-0.2.5")
    dev = sim.device()
    a = torch.linalg.cholesky(torch.eye(3) * 4).expand(1024, 3, 3).contiguous().to(dev)
    b = torch.randn(1024, 3, 1).to(dev)

    chooser = Chooser("aten::linalg_solve_triangular")
    key = (a.shape, b.shape, a.dtype, True, False)

    def costs() -> Any:
        return lu.solve_triangular_cost(a, b, upper=False)

    chooser.on_device(key, costs)  # decided once; every call below finds it

    def as_the_kernel_asks() -> bool:
        left, unitriangular = True, False
        return chooser.on_device(
            (a.shape, b.shape, a.dtype, left, unitriangular),
            lambda: lu.solve_triangular_cost(a, b, upper=False),
        )

    rows = [
        (
            "choice, key given (a dictionary lookup)",
            _ns(lambda: chooser.on_device(key, costs), repeat),
        ),
        ("choice, as the kernel asks (key built, lambda made)", _ns(as_the_kernel_asks, repeat)),
        ("one device kernel (a + b, 1024x3x1)", _ns(lambda: b + b, repeat // 10)),
        (
            "solve_triangular 1024x3x3, composed (13 kernels)",
            _ns(lambda: torch.linalg.solve_triangular(a, b, upper=False), repeat // 100),
        ),
    ]
    for label, ns in rows:
        print(f"{label:55s} {ns:12.0f} ns")
    opfix.uninstall()


if __name__ == "__main__":
    main()
