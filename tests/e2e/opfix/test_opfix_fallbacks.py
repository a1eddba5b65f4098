"""Operators torch-directml 0.2.5 sends to the CPU that YOLO training meets every step: with
dmlpatch they run on the device (no fallback, no copy) and equal the CPU within one float32
rounding; without it they fall back, with DirectML's warning."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.e2e.opfix.helpers import no_copies, without_fixes

import dmlpatch.sim as sim

# What these tests check is the compositions: the cost model would send some of these small
# calls through the fallback (test_opfix_fix_costs checks the choice).
pytestmark = pytest.mark.usefixtures("composed")


def _close(device_result: torch.Tensor, cpu_result: torch.Tensor) -> bool:
    got = device_result.cpu()
    return got.dtype == cpu_result.dtype and torch.allclose(got, cpu_result, rtol=2e-7, atol=2e-7)


CASES = {
    # name: (function of (device-or-cpu tensors...), CPU inputs, the operator DirectML lacks)
    "silu_backward": (
        lambda g, x: torch.ops.aten.silu_backward(g, x),
        (torch.randn(64, 9), torch.randn(64, 9) * 4),
        "aten::silu_backward.grad_input",
    ),
    "lerp_ scalar (EMA)": (
        lambda a, b: a.clone().lerp_(b, 0.0001),
        (torch.randn(300), torch.randn(300)),
        "aten::lerp.Scalar_out",
    ),
    "lerp scalar >= 0.5": (
        lambda a, b: torch.lerp(a, b, 0.75),
        (torch.randn(300), torch.randn(300)),
        "aten::lerp.Scalar_out",
    ),
    "lerp tensor weight": (
        lambda a, b, w: torch.lerp(a, b, w),
        (torch.randn(300), torch.randn(300), torch.rand(300) * 2 - 0.5),
        "aten::lerp.Tensor_out",
    ),
    "nan_to_num": (
        lambda x: x.nan_to_num(),
        (torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.5]),),
        "aten::nan_to_num.out",
    ),
    "nan_to_num_ values": (
        lambda x: x.clone().nan_to_num_(1.5, 100.0, -100.0),
        (torch.tensor([float("nan"), float("inf"), -float("inf"), 3.0]),),
        "aten::nan_to_num.out",
    ),
    "addmv": (
        lambda s, m, v: torch.addmv(s, m, v, beta=0.5, alpha=2.0),
        (torch.randn(5), torch.randn(5, 7), torch.randn(7)),
        "aten::addmv.out",
    ),
    "addmv beta 0 ignores NaN": (
        lambda s, m, v: torch.addmv(s, m, v, beta=0),
        (torch.full((5,), float("nan")), torch.randn(5, 7), torch.randn(7)),
        "aten::addmv.out",
    ),
    "addmv of integers with fractional scalars (PyTorch's samples: they truncate to 0 and 2)": (
        lambda s, m, v: torch.addmv(s, m, v, beta=0.2, alpha=2.6),
        (torch.randint(-5, 5, (5,)), torch.randint(-5, 5, (5, 7)), torch.randint(-5, 5, (7,))),
        "aten::addmv.out",
    ),
    "bincount": (
        lambda i: torch.bincount(i, minlength=12),
        (torch.tensor([0, 3, 3, 1, 7, 7, 7]),),
        "aten::bincount",
    ),
    "log_sigmoid forward": (
        lambda x: torch.ops.aten.log_sigmoid_forward(x)[0],
        (torch.randn(50) * 30,),
        "aten::log_sigmoid_forward",
    ),
    "log_sigmoid buffer": (
        lambda x: torch.ops.aten.log_sigmoid_forward(x)[1],
        (torch.randn(50) * 30,),
        "aten::log_sigmoid_forward",
    ),
    "log_sigmoid backward": (
        lambda g, x: torch.ops.aten.log_sigmoid_backward(g, x, torch.exp(-x.abs())),
        (torch.randn(50), torch.randn(50) * 30),
        "aten::log_sigmoid_backward",
    ),
    "bincount weights": (
        lambda i, w: torch.bincount(i, w),
        (torch.tensor([0, 3, 3, 1]), torch.rand(4)),
        "aten::bincount",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixed_on_device_equal_to_cpu_without_copies(dev: torch.device, name: str) -> None:
    function, inputs, _ = CASES[name]
    expected = function(*inputs)
    on_device = [x.to(dev) for x in inputs]
    sim.reset_counters()
    got = function(*on_device)
    counters = sim.counters()
    assert no_copies(counters), counters
    assert got.device == dev
    if expected.is_floating_point():
        assert _close(got, expected)
    else:
        assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_without_dmlpatch_directml_falls_back(dev: torch.device, name: str) -> None:
    function, inputs, op = CASES[name]
    on_device = [x.to(dev) for x in inputs]
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        function(*on_device)
        assert op in sim.counters()["ops"]["fallback"]


def test_silu_gradient_through_autograd(dev: torch.device) -> None:
    x = torch.randn(8, 16, requires_grad=True)
    grad = torch.randn(8, 16)
    F.silu(x).backward(grad)
    on_device = x.detach().to(dev).requires_grad_()
    output = F.silu(on_device)
    sim.reset_counters()
    output.backward(grad.to(dev))
    counters = sim.counters()
    assert counters["ops"]["fallback"] == {}
    assert counters["ops"]["fixed"] == {"aten::silu_backward.grad_input": 1}
    assert _close(on_device.grad, x.grad)


def test_bce_with_logits_forward_and_backward(dev: torch.device) -> None:
    """ultralytics' BCEWithLogitsLoss: log_sigmoid both ways, on the device."""
    logits = (torch.randn(6, 7) * 5).requires_grad_()
    target = torch.rand(6, 7)
    F.binary_cross_entropy_with_logits(logits, target).backward()
    on_device = logits.detach().to(dev).requires_grad_()
    target_on_device = target.to(dev)
    sim.reset_counters()
    loss = F.binary_cross_entropy_with_logits(on_device, target_on_device)
    loss.backward()
    counters = sim.counters()
    assert counters["ops"]["fallback"] == {}, counters["ops"]["fallback"]
    assert _close(on_device.grad, logits.grad)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 40),
    st.floats(-1.0, 2.0, allow_nan=False),
    st.sampled_from((torch.float32, torch.float64)),
    st.integers(0, 2**32 - 1),
)
def test_lerp_any_weight(
    dev: torch.device, size: int, weight: float, dtype: torch.dtype, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)  # inputs hypothesis can replay
    a = torch.randn(size, dtype=dtype, generator=generator)
    b = torch.randn(size, dtype=dtype, generator=generator)
    got = torch.lerp(a.to(dev), b.to(dev), weight).cpu()
    expected = torch.lerp(a, b, weight)
    # The CPU kernel fuses the multiply-add (one rounding); the composition rounds twice. Both
    # are within a few roundings of the terms' size, which near a cancelling zero is far
    # larger than of the result.
    terms = a.abs() + (weight * (b - a)).abs() + b.abs()
    assert bool(((got - expected).abs() <= 4 * torch.finfo(dtype).eps * terms).all())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=50), st.integers(0, 40))
def test_bincount_any_input(dev: torch.device, values: list[int], minlength: int) -> None:
    index = torch.tensor(values, dtype=torch.long)
    assert torch.equal(
        torch.bincount(index.to(dev), minlength=minlength).cpu(),
        torch.bincount(index, minlength=minlength),
    )


def test_bincount_errors_match_the_cpu(dev: torch.device) -> None:
    for bad in (torch.tensor([1, -1]), torch.ones(2, 2, dtype=torch.long)):
        with pytest.raises(RuntimeError, match="bincount only supports 1-d non-negative"):
            torch.bincount(bad.to(dev))


SCALAR_FALLBACKS = """
import json, torch
from torchvision.transforms import functional as TF

torch.manual_seed(0)
image = torch.rand(2, 3, 8, 8, device="cuda")
x = torch.randn(16, device="cuda") * 3
out = torch.empty(16, device="cuda")
torch.fmod(x, 1.5, out=out)
results = {
    "fmod": torch.fmod(x, 1.0).tolist(),
    "method": x.fmod(0.5).tolist(),
    "inplace": x.clone().fmod_(2).tolist(),
    "out": out.tolist(),
    "integers": torch.fmod(torch.arange(-6, 6, device="cuda"), 4).tolist(),
    "hue": TF.adjust_hue(image, 0.1).flatten().tolist(),
}
print(json.dumps(results))
"""


def test_fallbacks_given_a_python_number_where_the_schema_takes_a_tensor(tmp_path) -> None:
    """torch.fmod(x, 1.0) falls back on DirectML through fmod.Scalar's composite, which hands
    fmod.Tensor a wrapped number: the counting CPU kernel a run installs called fmod.Tensor
    with a float ('Expected a value of type Tensor'), which stopped torchvision's adjust_hue
    (ColorJitter(hue=...)). Equal to the CPU, as a program runs it."""
    from tests.support import clean_env, run_python

    script = tmp_path / "scalars.py"
    script.write_text(SCALAR_FALLBACKS, encoding="utf-8")
    runs = {}
    for device in ("sim", "cpu"):
        run = run_python(["-m", "dmlpatch", "--device", device, str(script)], env=clean_env())
        assert run.code == 0, run.err[-3000:]
        runs[device] = json.loads(run.out)
    for key, expected in runs["cpu"].items():
        assert runs["sim"][key] == pytest.approx(expected, abs=1e-6), key
