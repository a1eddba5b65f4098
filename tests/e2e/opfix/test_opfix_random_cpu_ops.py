"""normal_ for pytorch-directml 1.8 (Box-Muller over uniform_), DMLPATCH_CPU_OPS, and the
version gate that decides which fixes a backend gets."""

from __future__ import annotations

import os

import pytest
import torch
from tests.e2e.opfix.helpers import PROFILE, identical
from tests.e2e.sim.helpers import run_json

import dmlpatch.sim as sim
from dmlpatch import environment_variables, opfix
from dmlpatch.errors import UsageError
from dmlpatch.gaps import profiles


def test_normal_on_the_2022_package() -> None:
    result = run_json(
        """
        import json, torch, dmlpatch.sim as sim
        from dmlpatch import opfix
        sim.load(); d = sim.device()
        try:
            torch.empty(4, device=d).normal_()
            refused = None
        except RuntimeError as error:
            refused = str(error)
        installed = opfix.install("sim", sim.profile())
        sim.reset_counters()
        torch.manual_seed(7)
        got = torch.empty(1000, device=d).normal_(2.0, 3.0)
        odd = torch.empty(37, device=d).normal_()
        noise = torch.randn(4, 1, 8, 8, device=d)  # StyleGAN2's noise injection path
        big = torch.empty(200_000, device=d).normal_()
        counters = sim.counters()
        torch.manual_seed(7)
        want = torch.empty(1000).normal_(2.0, 3.0)
        want_odd = torch.empty(37).normal_()
        print(json.dumps({
            "refused": refused, "fixes": list(installed.fixes),
            "max_diff": (got.cpu() - want).abs().max().item(),
            "max_diff_odd": (odd.cpu() - want_odd).abs().max().item(),
            "mean": big.mean().item(), "std": big.std().item(),
            "noise_std": noise.std().item(), "noise_device": str(noise.device),
            "transfers": counters["transfers"], "fixed": counters["ops"]["fixed"],
            "fallback": counters["ops"]["fallback"],
        }))
        """,
        DMLPATCH_SIM_PROFILE="pytorch-directml-1.8",
    )
    assert result["refused"] == (
        "Could not run 'aten::normal_' with arguments from the 'DML' backend."
    )
    assert "aten::normal_" in result["fixes"]
    # Seed for seed the CPU's values (same uniforms, same transform) up to log/sin/cos rounding.
    assert result["max_diff"] < 1e-4 and result["max_diff_odd"] < 1e-4
    assert abs(result["mean"]) < 0.01 and abs(result["std"] - 1) < 0.01
    assert result["noise_device"] == "privateuseone:0" and 0.5 < result["noise_std"] < 1.5
    assert all(result["transfers"][k]["count"] == 0 for k in ("h2d", "d2h", "d2d"))
    assert result["fixed"] == {"aten::normal_": 4} and result["fallback"] == {}


def test_normal_is_native_on_0_2_5(dev: torch.device) -> None:
    assert "aten::normal_" not in opfix.installed().fixes


def test_cpu_ops_forces_named_operators_to_the_cpu(dev: torch.device) -> None:
    a = torch.arange(6.0).reshape(2, 3)
    b = torch.full((2, 3), 0.5)
    da, db = a.to(dev), b.to(dev)
    os.environ[environment_variables.DMLPATCH_CPU_OPS] = "aten::add, aten::unique_dim"
    try:
        opfix.uninstall()
        installed = opfix.install("sim", PROFILE)
        assert "aten::add.Tensor" in installed.cpu_ops and "aten::add_.Tensor" in installed.cpu_ops
        assert "aten::unique_dim" not in installed.fixes  # the user's choice wins
        sim.reset_counters()
        total = da + db
        da.add_(db)
        counters = sim.counters()
    finally:
        del os.environ[environment_variables.DMLPATCH_CPU_OPS]
        opfix.uninstall()
        opfix.install("sim", PROFILE)
    assert identical(total, a + b) and identical(da, a + b)
    assert counters["ops"]["fallback"] == {"aten::add.Tensor": 1, "aten::add_.Tensor": 1}
    # add: a and b to the CPU, the result back; add_: a and b to the CPU, a back.
    assert counters["copies"] == {
        "aten::add.Tensor": {"count": 3, "bytes": 72},
        "aten::add_.Tensor": {"count": 3, "bytes": 72},
    }
    assert counters["transfers"]["d2h"] == {"count": 4, "bytes": 96}
    assert counters["transfers"]["h2d"] == {"count": 2, "bytes": 48}


def test_cpu_ops_bad_names_are_one_line_errors(dev: torch.device) -> None:
    from dmlpatch.opfix import cpu_ops

    with pytest.raises(UsageError, match="no operator named 'aten::no_such_op'"):
        cpu_ops.resolve("aten::no_such_op")
    with pytest.raises(UsageError, match="not an operator name"):
        cpu_ops.resolve("index_add")
    with pytest.raises(UsageError, match=r"aten::conv2d never reaches the device.*convolution"):
        cpu_ops.resolve("aten::conv2d")
    with pytest.raises(UsageError, match="aten::cudnn_convolution cannot run on the CPU"):
        cpu_ops.resolve("aten::cudnn_convolution")
    # The backend's convolution runs as the CPU's; its out= form (no CPU kernel) is left out.
    names = [op.name() for op in cpu_ops.resolve("aten::convolution_overrideable")]
    assert names == ["aten::convolution_overrideable"]


def test_fixes_follow_the_profile_and_the_release() -> None:
    assert profiles.profile_for_release("0.2.5.dev240914") == "torch-directml-0.2.5"
    assert profiles.profile_for_release("0.2.0.dev230426") == "torch-directml-0.2.5"
    assert profiles.profile_for_release("0.3.0") == "torch-directml-0.2.5"
    assert profiles.profile_for_release(None) is None
    permissive = opfix.gaps("permissive")
    assert not any(opfix.needed(k, permissive) for k in opfix.kernels())
    release = opfix.gaps("torch-directml-0.2.5")
    chosen = {k.qualified for k in opfix.kernels() if opfix.needed(k, release)}
    assert "aten::normal_" not in chosen and "aten::_unique2" in chosen
    assert {"aten::mul.Tensor", "aten::nll_loss_backward"} <= chosen  # wrong answers
    old = opfix.gaps("pytorch-directml-1.8")
    assert "aten::normal_" in {k.qualified for k in opfix.kernels() if opfix.needed(k, old)}


@pytest.mark.usefixtures("composed")  # the compositions, whatever the cost model would pick
def test_every_fix_is_composed_of_native_operators(dev: torch.device) -> None:
    """Run each fixed call and check the simulated backend saw only native operators."""
    x = torch.tensor([[3, 1, 3], [1, 1, 7]], device=dev)
    f = torch.randn(1, 2, 6, 6, device=dev)
    sim.reset_counters()
    x.unique(return_inverse=True, return_counts=True)
    torch.unique(x, dim=1, return_counts=True)
    torch.unique_consecutive(x, return_inverse=True, dim=0)
    torch.nn.functional.avg_pool2d(f, 3, 2, 1, True, divisor_override=2)
    torch.nn.functional.avg_pool2d(x.view(1, 1, 2, 3), 2, 1, divisor_override=3)
    f.repeat(1, 1, 1, 1, 2)
    torch.zeros(3, 4, device=dev).scatter_(1, x[:, :2], 1.0)
    counters = sim.counters()
    assert counters["ops"]["fallback"] == {} and counters["ops"]["refused"] == {}
    assert sum(counters["ops"]["fixed"].values()) == 7
    assert sim.counters()["transfers"]["h2d"]["count"] == 0
