"""Counters are exact on scripted sequences (the evidence other issues rely on)."""

from __future__ import annotations

import json

import pytest
import torch
from tests.e2e.sim.helpers import run_json

import dmlpatch.sim as sim


def test_counters_shape_is_json(dev: torch.device) -> None:
    sim.reset_counters()
    c = sim.counters()
    json.dumps(c)
    assert set(c) == {"transfers", "syncs", "ops", "copies", "first_calls"}
    assert set(c["transfers"]) == {"h2d", "d2h", "d2d"}
    assert set(c["ops"]) == {"native", "fixed", "fallback", "refused"}
    assert c["transfers"]["h2d"] == {"count": 0, "bytes": 0} and c["syncs"] == 0


def test_transfers_and_syncs(dev: torch.device) -> None:
    x = torch.randn(10, 3)  # 120 bytes
    sim.reset_counters()
    y = x.to(dev)
    c = sim.counters()
    assert c["transfers"]["h2d"] == {"count": 1, "bytes": 120}
    assert c["transfers"]["d2h"]["count"] == 0
    z = (y * 2).cpu()
    c = sim.counters()
    assert c["transfers"]["d2h"] == {"count": 1, "bytes": 120}
    assert c["transfers"]["h2d"]["count"] == 1
    assert torch.equal(z, x * 2)
    y.sum().item()
    y[0, 0].item()
    assert sim.counters()["syncs"] == 2
    assert sim.counters()["transfers"]["d2d"]["count"] == 0


def test_same_device_copies_are_not_transfers(dev: torch.device) -> None:
    y = torch.randn(4, 4, device=dev)
    sim.reset_counters()
    y.clone()
    y.t().contiguous()
    torch.empty(4, 4, device=dev).copy_(y)
    t = sim.counters()["transfers"]
    assert all(t[k]["count"] == 0 for k in ("h2d", "d2h", "d2d"))


def test_ops_counted_per_call(dev: torch.device) -> None:
    a = torch.randn(8, device=dev)
    sim.reset_counters()
    for _ in range(3):
        a + a
    a.mul_(2)
    ops = sim.counters()["ops"]
    assert ops["native"]["aten::add.out"] == 3
    assert ops["native"]["aten::mul.out"] == 1
    assert ops["fallback"] == {} and ops["refused"] == {}


def test_fallback_costs_no_counted_copies(dev: torch.device) -> None:
    a = torch.randn(16, device=dev)
    b = torch.randn(16, device=dev)
    sim.reset_counters()
    for _ in range(4):
        out = torch.lerp(a, b, 0.25)  # lerp has no DirectML kernel
    c = sim.counters()
    assert c["ops"]["fallback"] == {"aten::lerp.Scalar_out": 4}
    assert all(c["transfers"][k] == {"count": 0, "bytes": 0} for k in ("h2d", "d2h", "d2d"))
    # What the calls cost on DirectML: a and b to the CPU, the result back, per call.
    assert c["copies"] == {"aten::lerp.Scalar_out": {"count": 12, "bytes": 768}}
    assert c["syncs"] == 0
    assert out.device == dev


def test_refusals_counted_and_reset(dev: torch.device) -> None:
    x = torch.tensor([1, 2, 2], device=dev)
    sim.reset_counters()
    for _ in range(2):
        with pytest.raises(RuntimeError):
            x.unique(return_counts=True)
    assert sim.counters()["ops"]["refused"] == {"aten::_unique2": 2}
    sim.reset_counters()
    assert sim.counters()["ops"]["refused"] == {}


def test_first_call_stacks_with_trace() -> None:
    result = run_json(
        """
        import json, torch, dmlpatch.sim as sim
        sim.load()
        d = sim.device()
        def user_function():
            return torch.lerp(torch.ones(3, device=d), torch.zeros(3, device=d), 0.5)
        user_function(); user_function()
        try:
            torch.tensor([1, 1], device=d).unique(return_inverse=True)
        except RuntimeError:
            pass
        c = sim.counters()
        sim.reset_counters()
        print(json.dumps({"first": c["first_calls"], "after_reset": sim.counters()["first_calls"],
                          "fallback": c["ops"]["fallback"]}))
        """,
        DMLPATCH_TRACE="1",
    )
    first = result["first"]
    assert set(first) == {"aten::lerp.Scalar_out", "aten::_unique2"}
    assert "user_function" in first["aten::lerp.Scalar_out"]
    assert "_ops.py" not in first["aten::lerp.Scalar_out"].splitlines()[-2]
    assert result["fallback"] == {"aten::lerp.Scalar_out": 2}
    assert result["after_reset"] == {}


def test_no_stacks_without_trace(dev: torch.device) -> None:
    sim.reset_counters()
    torch.lerp(torch.ones(2, device=dev), torch.ones(2, device=dev), 0.1)
    assert sim.counters()["first_calls"] == {}
