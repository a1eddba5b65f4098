"""Autocast on the simulated DirectML device against CUDA's own autocast and the CPU.

PyTorch's own autocast test lists (``torch.testing._internal.autocast_test_lists``, the cases
``test_cuda.py`` runs) are run three ways: under ``torch.autocast("privateuseone")`` on the
device; under CUDA's autocast kernels on fake CUDA tensors (this torch's ``AutocastCUDA``
kernels run without a GPU, on tensors with no data), whose result dtypes are the oracle for the
device's; and on the CPU without autocast, the arguments cast to the dtype CUDA's lists run
them in, whose values the device must give.
"""

from __future__ import annotations

import collections.abc
import gc
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import torch
from tests.e2e.opfix.helpers import close
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.autocast_test_lists import AutocastTestLists

import dmlpatch.sim as sim
from dmlpatch.opfix import installer
from dmlpatch.opfix.precision import autocast, autocast_policy

#: The lists whose third element, where there is one, says to skip (cuDNN's own operators).
_SKIP_FLAG_LISTS = ("torch_fp16",)
#: list name -> (the module its operators are called from, the dtype they run in).
LISTS: dict[str, tuple[Any, torch.dtype]] = {
    "torch_fp16": (torch, torch.float16),
    "torch_fp32": (torch, torch.float32),
    "torch_need_autocast_promote": (torch, torch.float32),
    "nn_fp16": (torch._C._nn, torch.float16),
    "nn_fp32": (torch._C._nn, torch.float32),
    "linalg_fp16": (torch._C._linalg, torch.float16),
    "methods_fp16": (None, torch.float16),
    "methods_fp32": (None, torch.float32),
}


def _cases(lists: AutocastTestLists) -> list[tuple[str, int, str, tuple, dict]]:
    cases = []
    for name in LISTS:
        for index, entry in enumerate(getattr(lists, name)):
            op, args = entry[0], entry[1]
            kwargs: dict = {}
            if len(entry) == 3:
                if name in _SKIP_FLAG_LISTS:
                    continue  # torch's own test skips these (cuDNN's; einsum's malformed entry)
                kwargs = entry[2]
            cases.append((name, index, op, args, kwargs))
    return cases


def _call(module: Any, op: str, args: tuple, kwargs: dict) -> Any:
    if module is not None and hasattr(module, op):
        return getattr(module, op)(*args, **kwargs)
    return getattr(args[0], op)(*args[1:], **kwargs)


def _map(value: Any, tensor: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, tensor) for item in value)
    return value


def _fake_cuda(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(
        tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cuda"
    ).requires_grad_(tensor.requires_grad)


def _dtypes(value: Any) -> Any:
    return _map(value, lambda tensor: tensor.dtype)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    return _map(value, lambda t: t.to(dtype) if t.is_floating_point() else t)


#: Cases fake tensors cannot run on this machine (no meta kernel, so torch runs the real CUDA
#: kernel; which, differs between releases): their dtypes are checked against the list's own
#: expectation only.
NO_FAKE_KERNEL = {"grid_sampler", "gru_cell", "_convolution"}


@pytest.fixture(scope="module")
def device_lists(dev: torch.device) -> AutocastTestLists:
    torch.manual_seed(0)
    return AutocastTestLists(dev)


@pytest.fixture(scope="module")
def cuda_dtypes() -> dict[tuple[str, int], Any]:
    """Each case's result dtypes under CUDA's own autocast kernels (fake CUDA tensors)."""
    lists = AutocastTestLists(torch.device("cpu"))
    mode = FakeTensorMode()
    with mode:
        # torch.tensor(data, device="cuda") would need a GPU even here: CPU tensors stand in.
        for name in LISTS:
            setattr(lists, name, _map(getattr(lists, name), _fake_cuda))
    found: dict[tuple[str, int], Any] = {}
    torch.set_autocast_enabled("cuda", True)
    try:
        with mode:
            for name, index, op, args, kwargs in _cases(lists):
                try:
                    found[(name, index)] = _dtypes(_call(LISTS[name][0], op, args, kwargs))
                except (RuntimeError, NotImplementedError):
                    continue  # no meta kernel: fake tensors cannot run it (NO_FAKE_KERNEL)
    finally:
        torch.set_autocast_enabled("cuda", False)
        torch.clear_autocast_cache()
    return found


def test_every_operator_cuda_s_autocast_serves_has_a_policy(dev: torch.device) -> None:
    """This torch's CUDA autocast kernels, each with a DirectML kernel of the same policy
    (cuDNN's own aside)."""
    registered = autocast_policy.cuda_registered()
    assert len(registered) > 100
    missing = registered - set(autocast_policy.policies()) - set(autocast_policy.CUDNN_ONLY)
    assert missing == set()
    assert autocast.served() == registered - set(autocast_policy.CUDNN_ONLY)
    assert installer.fix_installed("precision.autocast")


def test_pytorch_s_autocast_lists_run_on_the_device_as_on_cuda(
    dev: torch.device,
    device_lists: AutocastTestLists,
    cuda_dtypes: dict[tuple[str, int], Any],
) -> None:
    """Every case: CUDA's result dtype, and the CPU's values computed in CUDA's dtypes."""
    ran = 0
    unfaked: set[str] = set()
    for name, index, op, args, kwargs in _cases(device_lists):
        module, run_as = LISTS[name]
        with torch.autocast("privateuseone"):
            assert torch.is_autocast_enabled("privateuseone")
            got = _call(module, op, args, kwargs)
        if (name, index) in cuda_dtypes:
            assert _dtypes(got) == cuda_dtypes[(name, index)], (name, op)
        else:
            unfaked.add(op)
        expected_dtype = run_as if name != "torch_need_autocast_promote" else torch.float32
        if isinstance(got, torch.Tensor):
            assert got.dtype == expected_dtype, (name, op)
        control = _call(module, op, _cast(_map(args, torch.Tensor.cpu), run_as), kwargs)
        for got_tensor, cpu_tensor in zip(_flat(got), _flat(control)):
            assert close(got_tensor, cpu_tensor), (name, op)
        ran += 1
    assert ran >= 80
    assert unfaked <= NO_FAKE_KERNEL


def _flat(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, collections.abc.Iterable):
        for item in value:
            yield from _flat(item)


def test_builtin_promotion_is_untouched(dev: torch.device, device_lists) -> None:
    """Operators autocast does not list keep torch's own type promotion."""
    for op, args, out_type in device_lists.torch_expect_builtin_promote:
        with torch.autocast("privateuseone"):
            got = getattr(torch, op)(*args)
        if isinstance(got, torch.Tensor):
            assert got.dtype == out_type, op
    for op, args, out_type in device_lists.methods_expect_builtin_promote:
        with torch.autocast("privateuseone"):
            got = getattr(args[0], op)(*args[1:])
        assert got.dtype == out_type, op


def test_binary_cross_entropy_is_refused_with_cuda_s_text(dev: torch.device, device_lists) -> None:
    for op, args, module in device_lists.banned:
        with torch.autocast("privateuseone"), pytest.raises(RuntimeError, match="unsafe to"):
            getattr(module, op)(*args)
        getattr(module, op)(*args)  # outside a region it runs


def test_outside_a_region_nothing_is_cast(dev: torch.device) -> None:
    a, b = torch.randn(4, 4, device=dev), torch.randn(4, 4, device=dev)
    assert (a @ b).dtype == torch.float32
    with torch.autocast("privateuseone", enabled=False):
        assert (a @ b).dtype == torch.float32
    with torch.autocast("privateuseone"):
        assert (a @ b).dtype == torch.float16
        with torch.autocast("privateuseone", enabled=False):
            assert (a @ b).dtype == torch.float32  # nested, switched off
        assert (a @ b).dtype == torch.float16
    # float64, integers and CPU tensors are never cast
    with torch.autocast("privateuseone"):
        assert (a.cpu() @ b.cpu()).dtype == torch.float32
        ints = torch.ones(3, 3, dtype=torch.int64, device=dev)
        assert (ints @ ints).dtype == torch.int64


def test_weights_are_cast_once_per_region_and_the_cache_empties_at_its_end(
    dev: torch.device,
) -> None:
    layer = torch.nn.Linear(8, 8).to(dev)
    x = torch.randn(2, 8, device=dev)
    with torch.autocast("privateuseone"):
        layer(x)
        cached = dict(autocast._cache)
        assert id(layer.weight) in cached and id(layer.bias) in cached
        layer(x)
        assert autocast._cache[id(layer.weight)][1] is cached[id(layer.weight)][1]
        with torch.autocast("privateuseone"):
            layer(x)  # a nested region ends: the outer one keeps its casts
        assert id(layer.weight) in autocast._cache
    assert autocast._cache == {}
    with torch.autocast("privateuseone", cache_enabled=False):
        layer(x)
        assert autocast._cache == {}
    del cached
    gc.collect()


def test_a_training_step_casts_as_cuda_does_and_gradients_reach_float32_weights(
    dev: torch.device,
) -> None:
    """Forward in float16 under autocast, backward outside it: the weights' gradients are
    float32, equal to the CPU's computed with the same casts by hand."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, target = torch.randn(8, 16), torch.randn(8, 4)
    on_device = torch.nn.Sequential(*[layer for layer in _copy(model)]).to(dev)
    with torch.autocast("privateuseone"):
        out = on_device(x.to(dev))
        assert out.dtype == torch.float16
        loss = torch.nn.functional.mse_loss(out, target.to(dev))
        assert loss.dtype == torch.float32
    loss.backward()
    # The CPU, by hand: float16 linears, float32 loss.
    first, _, last = model
    hidden = torch.relu(
        torch.nn.functional.linear(x.half(), first.weight.half(), first.bias.half())
    )
    by_hand = torch.nn.functional.linear(hidden, last.weight.half(), last.bias.half())
    cpu_loss = torch.nn.functional.mse_loss(by_hand.float(), target)
    cpu_loss.backward()
    assert close(loss.detach(), cpu_loss.detach())
    for device_param, cpu_param in zip(on_device.parameters(), model.parameters()):
        assert device_param.grad is not None and device_param.grad.dtype == torch.float32
        assert torch.allclose(device_param.grad.cpu(), cpu_param.grad, rtol=1e-3, atol=1e-4)


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model)


def test_the_cost_inside_a_region_and_outside(dev: torch.device) -> None:
    """Outside a region no autocast kernel runs at all: the sim counts the same operators
    whether or not the fix is installed."""
    x = torch.randn(4, 4, device=dev)
    sim.reset_counters()
    for _ in range(3):
        x @ x
    native = dict(sim.counters()["ops"]["native"])
    assert native == {"aten::mm.out": 3}
    with torch.autocast("privateuseone"):
        sim.reset_counters()
        x @ x
        inside = dict(sim.counters()["ops"]["native"])
    # each argument cast (the same tensor twice: cast twice, as CUDA does), then mm
    assert inside == {"aten::empty_strided": 2, "aten::_copy_from": 2, "aten::mm.out": 1}


def _roi_cases(device: Any) -> list[tuple[str, tuple]]:
    """torchvision's operators with autocast kernels of their own, float16 inputs with float32
    boxes (or offsets), as its own test_autocast cases give them."""
    x = torch.rand(2, 8, 10, 10, dtype=torch.float16).to(device)
    boxes = torch.tensor([[0, 1.0, 1.0, 6.0, 7.0], [1, 0.5, 2.0, 9.0, 8.0]]).to(device)
    weight = torch.rand(8, 8, 3, 3).to(device)
    offset = torch.rand(2, 18, 8, 8).to(device)
    mask = torch.rand(2, 9, 8, 8).to(device)
    bias = torch.rand(8).to(device)
    dets = torch.tensor([[0, 0, 4, 4], [1, 1, 5, 5], [6, 6, 9, 9]], dtype=torch.float16)
    scores = torch.tensor([0.9, 0.8, 0.7])
    return [
        ("roi_align", (x, boxes, 0.5, 3, 3, 2, False)),
        ("roi_pool", (x, boxes, 0.5, 3, 3)),
        ("ps_roi_align", (x, boxes, 0.5, 2, 2, 2)),
        ("ps_roi_pool", (x, boxes, 0.5, 2, 2)),
        ("deform_conv2d", (x, weight, offset, mask, bias, 1, 1, 0, 0, 1, 1, 1, 1, True)),
        ("nms", (dets.to(device), scores.to(device), 0.3)),
    ]


def test_torchvision_s_operators_cast_as_on_cuda(dev: torch.device) -> None:
    """torchvision registers CUDA autocast kernels of its own (float32 inside, the input's dtype
    out): the device's give CUDA's dtypes and the CPU's float32 values, where before mixed
    dtypes stopped them (torchvision's RoI test_autocast)."""
    torchvision = pytest.importorskip("torchvision")
    registered = {
        name.split("::", 1)[1]
        for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
        if name.startswith("torchvision::")
    }
    assert registered == autocast.served("torchvision")
    ops = torch.ops.torchvision
    mode = FakeTensorMode()
    with mode:
        fake = _roi_cases("cpu")
        fake = [(name, _map(args, _fake_cuda)) for name, args in fake]
    torch.set_autocast_enabled("cuda", True)
    try:
        with mode:
            # nms's output shape depends on the data, which fake tensors lack: its indices are
            # int64 whatever autocast does.
            cuda = {name: _dtypes(getattr(ops, name)(*args)) for name, args in fake[:-1]}
            cuda["nms"] = torch.int64
    finally:
        torch.set_autocast_enabled("cuda", False)
    for name, args in _roi_cases(dev):
        with torch.autocast("privateuseone"):
            got = getattr(ops, name)(*args)
        assert _dtypes(got) == cuda[name], name
        cpu_args = _map(args, lambda t: t.cpu().float() if t.is_floating_point() else t.cpu())
        control = getattr(ops, name)(*cpu_args)
        for got_tensor, cpu_tensor in zip(_flat(got), _flat(control)):
            assert close(got_tensor, cpu_tensor.to(got_tensor.dtype)), name
    assert torchvision.ops.roi_align  # the public wrapper reaches the same kernel
