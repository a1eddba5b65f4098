"""A program that ends right after a backward pass on the device exits 0 (sim.autograd_exit).

Without the exit handler, torch 2.14 aborted such a run after its output (``terminate called
without an active exception``, exit code 134): about one run in five, and nine in ten once
``sys.setswitchinterval(1.0)`` lets the main thread keep the GIL into finalization while the
adapter's autograd thread waits for it to destroy the pass. The runs below widen the window so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from tests.e2e.sim.helpers import run_json, sim_env

RUNS = 5
# Where threads cannot be listed by name, the exit pass runs whether or not a backward did.
lists_threads = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="threads are named in /proc/self/task"
)

BACKWARD_THEN_EXIT = """
import sys
sys.setswitchinterval(1.0)
import torch
import dmlpatch.sim as sim
sim.load()
w = torch.ones(4, device=sim.device(0), requires_grad=True)
(w * 2).sum().backward()
print("done")
"""


def test_runs_that_end_right_after_a_backward_pass_exit_0() -> None:
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", BACKWARD_THEN_EXIT],
            env=sim_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(RUNS)
    ]
    ended = [(run.communicate(timeout=240), run.returncode) for run in runs]
    for (out, err), code in ended:
        assert (code, out.strip()) == (0, "done"), err


def _exit_figures(program: str) -> dict[str, object]:
    """What the program's last line printed, and the same figures read after the exit pass."""
    code = """
        import atexit, json, torch
        import dmlpatch.sim as sim
        from dmlpatch.costs import simulated
        from dmlpatch.sim import autograd_exit

        def figures():
            return {
                "counters": sim.counters(),
                "modelled": repr(simulated.priced()),
                "memory": [sim.memory_allocated(), sim.max_memory_allocated()],
                "threads": autograd_exit._autograd_threads_started(),
            }

        # Registered before the simulated device loads, so it runs after the device's exit
        # handler, as a run report's writer does.
        atexit.register(lambda: print(json.dumps({"after": figures()})))
        sim.load()
        device = sim.device(0)
    """
    ending = 'print(json.dumps({"before": figures()}))\n'
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + textwrap.dedent(program) + ending],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()[-2:]]
    return {**lines[0], **lines[1]}


def test_the_exit_pass_leaves_counters_costs_and_memory_as_the_program_left_them() -> None:
    seen = _exit_figures(
        """
        w = torch.ones(4, device=device, requires_grad=True)
        (w * 2).sum().backward()
        kept = w  # the program's tensors are still alive when its exit handlers run
        """
    )
    assert seen["before"]["threads"] is not False  # there was something to drain
    assert seen["after"] == seen["before"]


@lists_threads
def test_a_program_without_backward_starts_no_autograd_threads_at_exit() -> None:
    seen = _exit_figures("x = torch.ones(4, device=device) * 2\n")
    assert seen["before"]["threads"] is False
    assert seen["after"] == seen["before"]


@lists_threads
def test_the_exit_pass_reaches_every_adapter_thread() -> None:
    reached = run_json(
        """
        import json, threading, torch
        import dmlpatch.sim as sim
        from dmlpatch.sim import autograd_exit

        sim.load()
        for index in range(sim.device_count()):
            w = torch.ones(2, device=sim.device(index), requires_grad=True)
            (w * 2).sum().backward()
        threads = []
        backward = autograd_exit._NoGradient.backward

        def noted(ctx, grad):
            name = open(f"/proc/self/task/{threading.get_native_id()}/comm").read().strip()
            threads.append([name, str(grad.device)])
            return backward(ctx, grad)

        autograd_exit._NoGradient.backward = staticmethod(noted)
        autograd_exit.drain()
        print(json.dumps(threads))
        """,
        DMLPATCH_SIM_DEVICES="2",
    )
    assert reached == [
        ["pt_autograd_0", "privateuseone:0"],
        ["pt_autograd_1", "privateuseone:1"],
    ]


def test_the_exit_pass_never_leaves_an_adapter_thread_the_last_reference() -> None:
    """An adapter's thread lets go of the exit pass just after the exiting thread has returned
    from it: had the pass's Python objects (its node's context, its tensors) no other owner,
    that thread would free them during finalization, taking the GIL, and abort the run. They
    outlive the pass."""
    alive = run_json(
        """
        import gc, json, weakref, torch
        import dmlpatch.sim as sim
        from dmlpatch.sim import autograd_exit

        sim.load()
        for index in range(sim.device_count()):
            w = torch.ones(2, device=sim.device(index), requires_grad=True)
            (w * 2).sum().backward()
        contexts = []
        backward = autograd_exit._NoGradient.backward

        def noted(ctx, grad):
            contexts.append(weakref.ref(ctx))
            return backward(ctx, grad)

        autograd_exit._NoGradient.backward = staticmethod(noted)
        autograd_exit.drain()
        gc.collect()
        print(json.dumps([context() is not None for context in contexts]))
        """,
        DMLPATCH_SIM_DEVICES="2",
    )
    assert alive == [True, True]
