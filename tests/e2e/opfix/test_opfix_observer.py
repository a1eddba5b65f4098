"""The dispatch-level observer (real DirectML's accounting), checked against the simulated
device's backend counters as a stand-in for DirectML."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import PROFILE

import dmlpatch.sim as sim
from dmlpatch.opfix import _accounting
from dmlpatch.opfix.observer import Observer


def _program(dev: torch.device) -> None:
    x = torch.tensor([0, 0, 1, 3, 3], device=dev)
    a = torch.randn(4, 3, device=dev)
    for _ in range(3):
        x.unique(return_counts=True)  # fixed
        torch.hypot(a, a + 1)  # CPU fallback: a, a+1 out; result back
        a.hypot_(a * 2)  # fallback, in place: a and a*2 out; a back
    torch.nn.functional.relu(torch.nn.functional.conv2d(a.view(1, 1, 4, 3), a.view(1, 1, 4, 3)))
    with pytest.raises(RuntimeError):
        torch.scatter(a, 0, x[:2].view(2, 1), a, out=torch.empty_like(a))  # refused


def test_observer_matches_the_backend_counters(dev: torch.device) -> None:
    sim.reset_counters()
    with Observer(PROFILE) as observer, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DirectML's fallback warning
        _program(dev)
    seen = observer.snapshot()
    backend = sim.counters()
    for how in ("fixed", "fallback", "refused"):
        assert seen["ops"][how] == backend["ops"][how], how
    assert seen["copies"] == backend["copies"]
    assert seen["ops"]["fallback"] == {"aten::hypot.out": 6}
    assert seen["copies"]["aten::hypot.out"] == {"count": 18, "bytes": 864}
    assert set(seen["first_calls"]) == {
        "aten::hypot.out",
        "aten::_unique2",
        "aten::scatter.src_out",
    }
    assert "_program" in seen["first_calls"]["aten::hypot.out"]


def test_observer_costs_nothing_when_off(dev: torch.device) -> None:
    # Off: no mode on the dispatch stack and no sink beyond the backend's own counters.
    assert not torch._C._len_torch_dispatch_stack()
    with Observer(PROFILE):
        assert torch._C._len_torch_dispatch_stack() == 1
    assert not torch._C._len_torch_dispatch_stack()
    assert _accounting._sink is torch.ops.dmlpatch_sim.record_call
