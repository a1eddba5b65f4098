"""Tensor semantics on privateuseone:0: views, in-place, serialization, devices, dtypes."""

from __future__ import annotations

import io

import pytest
import torch
import torchvision
from tests.e2e.sim.helpers import run_json

import dmlpatch.sim as sim


def test_tensor_identity(dev: torch.device) -> None:
    t = torch.ones(2, device=dev)
    assert t.device == torch.device("privateuseone", 0)
    assert "device='privateuseone:0'" in repr(t)
    assert torch.get_device_module("privateuseone") is torch.privateuseone
    assert torch.privateuseone.device_count() == sim.device_count() == 1
    assert torch.privateuseone.device(0) == dev
    assert torch.privateuseone.get_amp_supported_dtype() == [torch.float16]
    assert torch.privateuseone.is_autocast_enabled() is False


def test_views_and_in_place(dev: torch.device) -> None:
    ref = torch.arange(24.0).reshape(4, 6)
    got = ref.to(dev)
    for t in (ref, got):
        t[1].add_(100)
        t[:, 2] = -1
        t.t()[3].mul_(2)
        v = t.view(2, 12)
        v[0, :3].zero_()
        t.narrow(1, 4, 2).copy_(torch.full((4, 2), 7.0, device=t.device))
        t.unsqueeze(0).expand(3, 4, 6)[0, 0, 0].fill_(42)
        d = t.diagonal()
        d += 0.5
    assert torch.equal(got.cpu(), ref)
    assert got.view(-1)._base is got


def test_views_made_by_cpu_kernels_are_normal_tensors(dev: torch.device) -> None:
    # unfold has no kernel of the simulator's own: the CPU kernel's view becomes a device view,
    # which must carry autograd's keys like its base (whisper's median filter, outside any
    # inference mode, once failed with "Cannot set version_counter for inference tensor").
    base = torch.arange(12.0).reshape(3, 4).to(dev).requires_grad_()
    windows = base.unfold(1, 2, 1)
    assert not windows.is_inference() and windows._base is base
    windows.sum().backward()
    assert torch.equal(base.grad.cpu(), torch.tensor([[1.0, 2.0, 2.0, 1.0]] * 3))
    with torch.no_grad():
        padded = torch.nn.functional.pad(base[None], (1, 1), mode="reflect")
        assert torch.equal(
            padded.unfold(-1, 3, 1).sort()[0].cpu(),
            torch.nn.functional.pad(base.detach().cpu()[None], (1, 1), mode="reflect")
            .unfold(-1, 3, 1)
            .sort()[0],
        )


def test_out_and_resize(dev: torch.device) -> None:
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    out = torch.empty(0, device=dev)
    torch.add(a.to(dev), b.to(dev), out=out)
    assert out.shape == (3, 5) and torch.equal(out.cpu(), a + b)
    grown = torch.empty(2, device=dev)
    with pytest.warns(UserWarning, match="resized"):
        torch.mul(a.to(dev), 2, out=grown)
    assert torch.equal(grown.cpu(), a * 2)
    r = torch.zeros(2, device=dev)
    r.resize_(4, 4)
    r.fill_(3)
    assert torch.equal(r.cpu(), torch.full((4, 4), 3.0))


def test_autograd_no_grad_and_parameters(dev: torch.device) -> None:
    p = torch.nn.Parameter(torch.randn(4, device=dev))
    with torch.no_grad():
        y = p * 2
    assert not y.requires_grad
    (p * p).sum().backward()
    assert torch.allclose(p.grad.cpu(), 2 * p.detach().cpu())


def test_a_cpu_zero_tensor_comes_back_as_zeros(dev: torch.device) -> None:
    # sgn's gradient of a real tensor is _efficientzerotensor, whose CPU kernel (run by the
    # fallback) has no memory behind it; reading it used to crash the process.
    x = torch.randn(5, device=dev, requires_grad=True)
    (gradient,) = torch.autograd.grad(torch.sgn(x).sum(), x)
    assert gradient.device == dev and torch.equal(gradient.cpu(), torch.zeros(5))


def test_save_load_round_trips(dev: torch.device) -> None:
    model = torch.nn.Linear(3, 2).to(dev)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    for location in (None, "cpu", dev, "privateuseone:0"):
        buf.seek(0)
        state = torch.load(buf, map_location=location)
        expected = torch.device("cpu") if location == "cpu" else dev
        assert all(v.device == expected for v in state.values())
        assert torch.equal(state["weight"].cpu(), model.weight.detach().cpu())
    cpu_buf = io.BytesIO()
    torch.save({"w": torch.arange(5.0)}, cpu_buf)
    cpu_buf.seek(0)
    loaded = torch.load(cpu_buf, map_location=dev)
    assert loaded["w"].device == dev and torch.equal(loaded["w"].cpu(), torch.arange(5.0))


def test_mixed_devices_are_refused(dev: torch.device) -> None:
    x = torch.ones(3, device=dev)
    with pytest.raises(
        RuntimeError,
        match=(
            r"^Expected all tensors to be on the same device, but found at least two devices, "
            r"privateuseone:0 and cpu!$"
        ),
    ):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3, device=dev), torch.ones(1, 1, 1, 1))
    assert torch.equal((x + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))  # CPU scalar
    assert torch.equal(x[torch.tensor([0, 2])].cpu(), torch.ones(2))  # CPU indices, as CUDA


#: DirectML's dtypes (no bfloat16 or complex: test_sim_fidelity checks their refusal).
@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ],
)
def test_dtypes(dev: torch.device, dtype: torch.dtype) -> None:
    ref = torch.arange(6).reshape(2, 3).to(dtype)
    got = ref.to(dev)
    assert got.dtype == dtype
    if dtype == torch.bool:
        assert torch.equal((got & ~got).cpu(), ref & ~ref)
    else:
        assert torch.equal((got * 2 + got).cpu(), ref * 2 + ref)
        if dtype != torch.uint8:  # DirectML cannot sum uint8 (test_sim_fidelity)
            assert torch.equal(got.sum(0).cpu(), ref.sum(0))


def test_random_ops_reproduce_cpu(dev: torch.device) -> None:
    def draw(device: torch.device | str) -> list[torch.Tensor]:
        torch.manual_seed(123)
        x = torch.randn(5, 5, device=device)
        u = torch.empty(7, device=device).uniform_()
        n = torch.empty(7, device=device).normal_(2.0, 3.0)
        drop = torch.nn.functional.dropout(torch.ones(8, 8, device=device), 0.5)
        perm = torch.randperm(10, device=device)
        return [t.cpu() for t in (x, u, n, drop, perm)]

    for a, b in zip(draw(dev), draw("cpu")):
        assert torch.equal(a, b)


def test_torchvision_ops_through_fallback(dev: torch.device) -> None:
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60.0]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    keep = torchvision.ops.nms(boxes.to(dev), scores.to(dev), 0.5)
    assert keep.device == dev and torch.equal(keep.cpu(), torchvision.ops.nms(boxes, scores, 0.5))
    feat = torch.randn(1, 3, 16, 16)
    rois = [boxes[:2]]
    ref = torchvision.ops.roi_align(feat, rois, output_size=2, spatial_scale=0.5)
    got = torchvision.ops.roi_align(
        feat.to(dev), [r.to(dev) for r in rois], output_size=2, spatial_scale=0.5
    )
    assert torch.equal(got.cpu(), ref)


def test_autocast_is_a_no_op_as_on_directml(dev: torch.device) -> None:
    x = torch.randn(4, 4, device=dev)
    with torch.autocast("privateuseone", dtype=torch.float16):
        y = x @ x
    assert y.dtype == torch.float32


def test_two_adapters_and_d2d_copies() -> None:
    result = run_json(
        """
        import json, torch, dmlpatch.sim as sim
        sim.load()
        a = torch.arange(4.0, device=sim.device(0))
        sim.reset_counters()
        b = a.to(sim.device(1))
        c = sim.counters()
        try:
            a + b
            mixed = ""
        except RuntimeError as e:
            mixed = str(e)
        print(json.dumps({"n": sim.device_count(), "names": [sim.device_name(i) for i in range(2)],
                          "b": str(b.device), "vals": b.cpu().tolist(),
                          "d2d": c["transfers"]["d2d"], "mixed": mixed,
                          "module": torch.privateuseone.device_name(1)}))
        """,
        DMLPATCH_SIM_DEVICES="2",
    )
    assert result["n"] == 2
    assert result["names"] == ["Simulated Radeon (discrete)", "Simulated UHD (integrated)"]
    assert result["module"] == "Simulated UHD (integrated)"
    # DirectML copies between adapters as zeros (microsoft/DirectML#443), and so does the
    # simulator (dmlpatch.opfix.tensors.transfers goes through the host instead).
    assert result["b"] == "privateuseone:1" and result["vals"] == [0.0, 0.0, 0.0, 0.0]
    assert result["d2d"] == {"count": 1, "bytes": 16}
    assert "privateuseone:0 and privateuseone:1" in result["mixed"]
