"""DirectML's gaps, exactly as it reports them, and the profile switch that changes them.

Each profile needs its own process (the backend loads once), so the probe below runs in a
subprocess per profile and reports every outcome as JSON.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.e2e.sim.helpers import run_json, run_python

from dmlpatch.gaps import registered_ops
from dmlpatch.gaps.profiles import PROFILES, RULES_0_2_5

PROBE = """
import json, warnings, torch, dmlpatch.sim as sim
import torch.nn.functional as F
sim.load()
d = sim.device()
x = torch.tensor([3, 1, 1, 2], device=d)
img = torch.randn(1, 1, 4, 4).to(d)
cases = {
    "unique_counts": lambda: torch.unique(x, return_counts=True),
    "unique_inverse": lambda: torch.unique(x, return_inverse=True),
    "unique_both": lambda: torch.unique(x, return_inverse=True, return_counts=True),
    "unique_plain": lambda: torch.unique(x),
    "avg_pool2d_divisor": lambda: F.avg_pool2d(img, 2, divisor_override=3),
    "avg_pool3d_divisor": lambda: F.avg_pool3d(img[None], (1, 2, 2), divisor_override=3),
    "avg_pool2d_plain": lambda: F.avg_pool2d(img, 2),
    "repeat_5d": lambda: torch.ones(1, 1, 1, 1, 2, device=d).repeat(1, 1, 1, 1, 2),
    "repeat_grows_to_5d": lambda: torch.ones(2, 2, device=d).repeat(1, 1, 1, 2, 1),
    "repeat_4d": lambda: torch.ones(1, 1, 1, 2, device=d).repeat(1, 1, 2, 2),
    "scatter_src_shape": lambda: torch.zeros(3, 4, device=d).scatter_(
        1, torch.zeros(3, 2, dtype=torch.long, device=d), torch.ones(3, 4, device=d)),
    "scatter_partial": lambda: torch.zeros(3, 4, device=d).scatter(
        1, torch.zeros(2, 2, dtype=torch.long, device=d), torch.ones(2, 2, device=d)),
    "scatter_value_partial": lambda: torch.zeros(3, 4, device=d).scatter(
        1, torch.zeros(2, 1, dtype=torch.long, device=d), 1.0),
    "scatter_ok": lambda: torch.zeros(3, 4, device=d).scatter(
        1, torch.zeros(3, 1, dtype=torch.long, device=d), 1.0),
    "one_hot": lambda: F.one_hot(torch.tensor([0, 2], device=d), 3),
    "normal_": lambda: torch.empty(3, device=d).normal_(),
    "randn": lambda: torch.randn(3, device=d),
    "float64": lambda: torch.ones(2, dtype=torch.float64, device=d) + 1,
    "float64_to": lambda: torch.ones(2).double().to(d),
    "lstm": lambda: torch.nn.LSTM(2, 2).to(d)(torch.randn(1, 1, 2).to(d)),
}
# microsoft/DirectML#602, verbatim: a model moved before inference_mode, called inside it.
linear = torch.nn.Linear(3, 128).eval().to(d)
conv = torch.nn.Conv2d(1, 2, 3).eval().to(d)
def in_inference_mode(fn):
    def run():
        with torch.inference_mode():
            return fn()
    return run
def made_inside():
    with torch.inference_mode():
        return torch.nn.Linear(3, 2).to(d)(torch.zeros(4, 3).to(d))
def no_grad_linear():
    with torch.no_grad():
        return linear(torch.zeros(4, 3).to(d))
cases.update({
    "inference_linear": in_inference_mode(lambda: linear(torch.zeros(4, 3).to(d))),
    "inference_conv2d": in_inference_mode(lambda: conv(img)),
    "inference_made_inside": made_inside,
    "inference_input_only": in_inference_mode(lambda: torch.zeros(4, 3).to(d) * 2),
    "no_grad_linear": no_grad_linear,
})
def set_data_across_devices():
    parameter = torch.nn.Parameter(torch.zeros(2, device=d))
    parameter.data = torch.ones(2)
cases.update({
    # openai-whisper's alignment_heads buffer, moved with the model (microsoft/DirectML#414).
    "sparse_to_device": lambda: torch.eye(3).to_sparse().to(d),
    "set_data_across_devices": set_data_across_devices,
})
cases.update({
    # microsoft/DirectML#619, #688, #704 and #421: uint8 sums, bfloat16 and complex tensors.
    "uint8_sum": lambda: torch.tensor([1], dtype=torch.uint8, device=d).sum(),
    "bfloat16": lambda: torch.ones(2, dtype=torch.bfloat16).to(d),
    "complex": lambda: torch.complex(torch.ones(2).to(d), torch.ones(2).to(d)),
    "stft": lambda: torch.stft(torch.randn(64).to(d), 16, return_complex=True),
    # A lazily conjugated device tensor copied: PyTorch's conjugate fallback used to recurse
    # through _copy_from until the stack ran out (a segfault).
    "conj_clone": lambda: conj_clone(),
    "float16": lambda: torch.ones(2, dtype=torch.float16, device=d) * 2,
    "generator": lambda: torch.randn(3, generator=torch.Generator(device=d), device=d),
})
def conj_clone():
    z = torch.tensor([1 + 2j, 3 - 4j])
    copied = torch.conj(z.to(d)).clone().cpu()
    assert torch.equal(copied, torch.conj(z).resolve_conj()), copied
def float_times_bool():
    # microsoft/DirectML#686 and #737, verbatim.
    t = torch.tensor([0.0, 1.0]).to(d)
    t *= t > 0
    x = torch.full((4,), -3.4e38, device=d)
    y = x * torch.tensor([True, False, True, False], device=d)
    return [str(t.dtype), t.cpu().tolist(), str(y.dtype), y.cpu().tolist()]
def cross_entropy_gradients():
    # microsoft/DirectML#739 and #740: reduction='none', then a weighted sum.
    sums = []
    for reduction in ("none", "mean"):
        logits = torch.linspace(-1, 1, 20).reshape(4, 5).to(d).requires_grad_()
        loss = F.cross_entropy(logits, torch.tensor([1, 2, 3, 0], device=d), reduction=reduction)
        (loss * torch.arange(1.0, 5.0, device=d) if reduction == "none" else loss).sum().backward()
        sums.append(round(logits.grad.abs().sum().item(), 4))
    return sums
def seeded():
    g = torch.Generator(device=d).manual_seed(7)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.manual_seed(7)
        first = torch.randn(3, device=d).cpu()
        torch.manual_seed(7)
        again = torch.randn(3, device=d).cpu()
    return {
        "generator_device": str(g.device),
        "generator_is_the_cpus": torch.equal(
            torch.randn(3, generator=g, device=d).cpu(),
            torch.randn(3, generator=torch.Generator().manual_seed(7)),
        ),
        "manual_seed_repeats": torch.equal(first, again),
        "warnings": [str(w.message) for w in seen],
    }
def across_adapters():
    if sim.device_count() < 2:
        return None
    t = torch.tensor([0.75, -1.5]).to(sim.device(0))
    return [t.to(sim.device(1)).cpu().tolist(), t.cpu().to(sim.device(1)).cpu().tolist()]
def answer(fn):
    try:
        return fn()
    except Exception as e:
        return [type(e).__name__, str(e).splitlines()[0]]
answers = {
    "float_times_bool": answer(float_times_bool),
    "cross_entropy_gradients": answer(cross_entropy_gradients),
    "seeded": answer(seeded),  # pytorch-directml 1.8 has no normal_
    "across_adapters": answer(across_adapters),
}
out = {"answers": answers}
for name, fn in cases.items():
    try:
        fn()
        out[name] = ["ok", ""]
    except Exception as e:
        out[name] = [type(e).__name__, str(e).splitlines()[0]]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for _ in range(3):
        torch.lerp(torch.ones(2, device=d), torch.zeros(2, device=d), 0.5)
        torch.atan2(torch.ones(2, device=d), torch.ones(2, device=d))
out["warnings"] = [[w.category.__name__, str(w.message), w.filename] for w in seen]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    # microsoft/DirectML#431: made on the device, eye is empty; moved there, it is right.
    out["eye_shapes"] = [list(torch.eye(3, device=d).shape), list(torch.eye(3).to(d).shape)]
out["counters"] = sim.counters()["ops"]
out["profile"] = sim.profile()
out["has_float64_support"] = torch.privateuseone.has_float64_support()
print(json.dumps(out))
"""

FALLBACK_TEXT = (
    "The operator 'aten::lerp.Scalar_out' is not currently supported on the DML backend and "
    "will fall back to run on the CPU. This may have performance implications."
)
COUNTS = "Return counts not implemented for unique operator for DirectML."
INVERSE = "Return inverse not implemented for unique operator for DirectML."
DIVISOR = "Divisor override isn't supported for DirectML."
SHAPE = "DirectML scatter doesn't allow for index and source to have different dimensions."
PARTIAL = (
    "DirectML scatter doesn't allow partially modified dimensions. Please update the dimension "
    "so that the indices and input only differ in the provided dimension."
)
NORMAL = "Could not run 'aten::normal_' with arguments from the 'DML' backend."
INFERENCE = "Cannot set version_counter for inference tensor"
SPARSE = (
    "Could not run 'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the "
    "'SparsePrivateUse1' backend."
)
#: Cases PyTorch itself refuses for a PrivateUse1 device, whatever its kernels.
PYTORCH_ITSELF = ("sparse_to_device", "set_data_across_devices")
SET_DATA = (
    "Attempted to call `variable.set_data(tensor)`, but `variable` and `tensor` have "
    "incompatible tensor type."
)


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Any]:
    return {
        "default": run_json(PROBE),
        "torch-directml-0.2.5": run_json(PROBE, DMLPATCH_SIM_PROFILE="torch-directml-0.2.5"),
        "pytorch-directml-1.8": run_json(PROBE, DMLPATCH_SIM_PROFILE="pytorch-directml-1.8"),
        "permissive": run_json(PROBE, DMLPATCH_SIM_PROFILE="permissive"),
        "no-float64": run_json(PROBE, DMLPATCH_SIM_FLOAT64="0"),
        "two-adapters": run_json(PROBE, DMLPATCH_SIM_DEVICES="2"),
        "permissive-two-adapters": run_json(
            PROBE, DMLPATCH_SIM_PROFILE="permissive", DMLPATCH_SIM_DEVICES="2"
        ),
    }


def test_default_profile_is_0_2_5(outcomes: dict[str, Any]) -> None:
    assert outcomes["default"]["profile"] == "torch-directml-0.2.5"
    assert outcomes["default"] == outcomes["torch-directml-0.2.5"]


def test_refusals_in_0_2_5(outcomes: dict[str, Any]) -> None:
    o = outcomes["torch-directml-0.2.5"]
    assert o["unique_counts"] == ["RuntimeError", COUNTS]
    assert o["unique_inverse"] == ["RuntimeError", INVERSE]
    assert o["unique_both"] == ["RuntimeError", COUNTS]
    assert o["avg_pool2d_divisor"] == ["RuntimeError", DIVISOR]
    assert o["avg_pool3d_divisor"] == ["RuntimeError", DIVISOR]
    assert o["repeat_5d"] == [
        "RuntimeError",
        "the dimesion of at::Tensor must be 4 or lower, but got 5",
    ]
    assert o["repeat_grows_to_5d"] == [
        "RuntimeError",
        "the dimesion of at::Tensor must be 4 or lower, but got 5",
    ]
    assert o["scatter_src_shape"] == ["RuntimeError", SHAPE]
    assert o["scatter_partial"] == ["RuntimeError", PARTIAL]
    assert o["scatter_value_partial"] == ["RuntimeError", PARTIAL]
    for fine in (
        "unique_plain",
        "avg_pool2d_plain",
        "repeat_4d",
        "scatter_ok",
        "one_hot",
        "normal_",
        "randn",
        "float64",
        "float64_to",
    ):
        assert o[fine] == ["ok", ""], fine
    assert o["lstm"][0] == "NotImplementedError"
    assert "'aten::_thnn_fused_lstm_cell' with arguments from the 'CPU' backend" in o["lstm"][1]
    assert o["counters"]["refused"]["aten::_unique2"] == 3


def test_sparse_tensors_and_set_data_fail_as_on_directml(outcomes: dict[str, Any]) -> None:
    o = outcomes["torch-directml-0.2.5"]
    kind, text = o["sparse_to_device"]
    assert kind == "NotImplementedError" and text.startswith(SPARSE), text
    assert o["set_data_across_devices"] == ["RuntimeError", SET_DATA]
    # PyTorch's own behaviour for any PrivateUse1 backend, so every profile has it.
    assert outcomes["permissive"]["set_data_across_devices"] == ["RuntimeError", SET_DATA]


def test_wrong_answers_of_0_2_5(outcomes: dict[str, Any]) -> None:
    """Kernels DirectML runs and gets wrong, as the reports print them; permissive is right."""
    wrong = outcomes["torch-directml-0.2.5"]["answers"]
    right = outcomes["permissive"]["answers"]
    bools = ["torch.bool", [False, True], "torch.bool", [True, False, True, False]]
    assert wrong["float_times_bool"] == bools
    floats = ["torch.float32", [0.0, 1.0], "torch.float32", [-3.4e38, -0.0, -3.4e38, -0.0]]
    assert right["float_times_bool"][0] == floats[0] and right["float_times_bool"][2] == floats[2]
    # reduction='none' loses every gradient; 'mean' keeps them.
    assert wrong["cross_entropy_gradients"][0] == 0.0
    assert wrong["cross_entropy_gradients"][1] == right["cross_entropy_gradients"][1] > 0
    assert right["cross_entropy_gradients"][0] > 0
    assert outcomes["two-adapters"]["answers"]["across_adapters"] == [
        [0.0, 0.0],
        [0.75, -1.5],
    ]
    assert outcomes["permissive-two-adapters"]["answers"]["across_adapters"] == [
        [0.75, -1.5],
        [0.75, -1.5],
    ]
    assert outcomes["torch-directml-0.2.5"]["uint8_sum"] == [
        "UnicodeDecodeError",
        "'utf-8' codec can't decode byte 0xcf in position 0: invalid continuation byte",
    ]
    assert outcomes["torch-directml-0.2.5"]["counters"]["refused"]["aten::sum.IntList_out"] == 1
    assert outcomes["permissive"]["uint8_sum"] == ["ok", ""]


def test_no_bfloat16_or_complex_tensors_on_0_2_5(outcomes: dict[str, Any]) -> None:
    """DirectML stops the process with this line; the simulator raises it."""
    o = outcomes["torch-directml-0.2.5"]
    assert o["bfloat16"] == ["RuntimeError", "Invalid or unsupported data type BFloat16."]
    assert o["complex"] == ["RuntimeError", "Invalid or unsupported data type ComplexFloat."]
    assert o["stft"] == ["RuntimeError", "Invalid or unsupported data type ComplexFloat."]
    assert o["float16"] == ["ok", ""]
    assert o["conj_clone"] == ["RuntimeError", "Invalid or unsupported data type ComplexFloat."]
    for name in ("bfloat16", "complex", "stft", "conj_clone"):
        assert outcomes["permissive"][name] == ["ok", ""], name


def test_generator_and_seeds_of_0_2_5(outcomes: dict[str, Any]) -> None:
    """torch-directml 0.2.5 registers a generator made on the CPU generator its random kernels
    draw from, and its device module seeds that one (the failures of #374 and #587 are earlier
    releases')."""
    o = outcomes["torch-directml-0.2.5"]
    assert o["generator"] == ["ok", ""]
    assert o["answers"]["seeded"] == {
        "generator_device": "cpu",
        "generator_is_the_cpus": True,
        "manual_seed_repeats": True,
        "warnings": [],
    }


def test_eye_made_on_the_device_is_empty(outcomes: dict[str, Any]) -> None:
    for profile in ("torch-directml-0.2.5", "pytorch-directml-1.8"):
        assert outcomes[profile]["eye_shapes"] == [[0], [3, 3]], profile
    assert outcomes["permissive"]["eye_shapes"] == [[3, 3], [3, 3]]


def test_inference_mode_refuses_tensors_made_outside_it(outcomes: dict[str, Any]) -> None:
    for profile in ("torch-directml-0.2.5", "pytorch-directml-1.8"):
        o = outcomes[profile]
        assert o["inference_linear"] == ["RuntimeError", INFERENCE], profile
        assert o["inference_conv2d"] == ["RuntimeError", INFERENCE], profile
        for fine in ("inference_made_inside", "inference_input_only", "no_grad_linear"):
            assert o[fine] == ["ok", ""], (profile, fine)
    refused = outcomes["torch-directml-0.2.5"]["counters"]["refused"]
    assert refused["aten::convolution_overrideable"] == 1


def test_fallback_warning_once_per_op(outcomes: dict[str, Any]) -> None:
    o = outcomes["torch-directml-0.2.5"]
    lerp = [w for w in o["warnings"] if "lerp" in w[1]]
    assert lerp == [["UserWarning", FALLBACK_TEXT, "<string>"]]  # attributed to the caller
    assert not [w for w in o["warnings"] if "atan2" in w[1]]  # native (atan2.out is listed)
    assert o["counters"]["fallback"]["aten::lerp.Scalar_out"] == 3
    assert o["counters"]["native"]["aten::atan2.out"] == 3


def test_pytorch_directml_1_8_lacks_normal(outcomes: dict[str, Any]) -> None:
    o = outcomes["pytorch-directml-1.8"]
    assert o["normal_"] == ["RuntimeError", NORMAL]
    assert o["randn"] == ["RuntimeError", NORMAL]
    assert o["unique_counts"] == ["RuntimeError", COUNTS]  # inherits 0.2.5's rules
    # normal_, randn, randn with a generator, the first seeded randn
    assert o["counters"]["refused"]["aten::normal_"] == 4


def test_permissive_has_no_gaps(outcomes: dict[str, Any]) -> None:
    o = outcomes["permissive"]
    for name, result in o.items():
        if name in PYTORCH_ITSELF:
            continue
        if isinstance(result, list) and len(result) == 2 and isinstance(result[0], str):
            assert result == ["ok", ""], name
    assert o["warnings"] == []
    assert o["counters"]["fallback"] == {} and o["counters"]["refused"] == {}
    assert o["counters"]["native"]["aten::lerp.Scalar_out"] == 3


def test_float64_switch(outcomes: dict[str, Any]) -> None:
    o = outcomes["no-float64"]
    text = "The GPU device does not support Double (Float64) operations!"
    assert o["float64"] == ["RuntimeError", text]
    assert o["float64_to"] == ["RuntimeError", text]
    assert o["has_float64_support"] is False
    assert outcomes["default"]["has_float64_support"] is True


def test_every_rule_has_a_source_and_is_exercised() -> None:
    for profile in PROFILES.values():
        for rule in profile.rules:
            assert rule.source and rule.message
    assert {r.op for r in RULES_0_2_5} == {
        "aten::_unique2",
        "aten::avg_pool2d",
        "aten::avg_pool3d",
        "aten::scatter",
        "aten::scatter_",
        "aten::repeat",
    }


def test_merged_names_are_native() -> None:
    index = registered_ops.load_index(None)
    native = registered_ops.native_set(registered_ops.listed_ops(), index)
    for name in (
        *registered_ops.EXPECTED_MERGED,
        "add.Tensor",
        "mul_.Tensor",
        "_softmax",
        "native_layer_norm",
        "view",
        "empty.memory_format",
    ):
        assert name in native, name
    for name in ("lerp.Scalar_out", "_thnn_fused_lstm_cell", "atan2.Tensor" + "_nope"):
        assert name not in native, name


def test_fault_injection_drops_scalar_writes() -> None:
    proc = run_python(
        """
        import torch, dmlpatch.sim as sim
        sim.load()
        t = torch.zeros(3, device=sim.device())
        t[1] = 5.0
        t.fill_(2.0)
        print(t.cpu().tolist())
        """,
        DMLPATCH_SIM_FAULT="drop-scalar-writes",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[2.0, 2.0, 2.0]"
    proc = run_python(
        "import torch, dmlpatch.sim as sim\nsim.load()\n"
        "t = torch.zeros(3, device=sim.device()); t[1] = 5.0; print(t.cpu().tolist())"
    )
    assert proc.stdout.strip() == "[0.0, 5.0, 0.0]"
