"""The ``_foreach_*`` operators of every optimizer step: torch-directml has none, so on torch
2.4.1 each step copies all parameters, gradients and states through the CPU
(microsoft/DirectML#604); the simulator sends them to its fallback on any torch. With dmlpatch
they run on the device as per-tensor operators, equal to the CPU."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from tests.e2e.opfix.helpers import without_fixes

import dmlpatch.sim as sim
from dmlpatch.opfix.optimizers import foreach

OPTIMIZERS: dict[str, tuple[type, dict[str, Any]]] = {
    "SGD nesterov": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    "Adam": (torch.optim.Adam, {"lr": 0.01}),
    "AdamW amsgrad": (torch.optim.AdamW, {"lr": 0.01, "amsgrad": True}),
    "RMSprop": (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5}),
    "Adagrad": (torch.optim.Adagrad, {"lr": 0.1}),
    "NAdam": (torch.optim.NAdam, {"lr": 0.01}),
    "RAdam": (torch.optim.RAdam, {"lr": 0.01}),
    # The fused path transformers' Trainer takes by default (optim="adamw_torch_fused").
    "AdamW fused": (torch.optim.AdamW, {"lr": 0.01, "fused": True}),
    "AdamW fused amsgrad": (
        torch.optim.AdamW,
        {"lr": 0.01, "fused": True, "amsgrad": True, "weight_decay": 0.1},
    ),
    "Adam fused decay maximize": (
        torch.optim.Adam,
        {"lr": torch.tensor(0.01), "fused": True, "weight_decay": 0.05, "maximize": True},
    ),
}


def _train(device: Any, name: str) -> list[torch.Tensor]:
    optimizer_class, options = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = model.to(device)
    optimizer = optimizer_class(model.parameters(), **options)
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randn(5, 2)
        loss = ((model(x.to(device)) - y.to(device)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_on_the_device_equal_to_cpu(dev: torch.device, name: str) -> None:
    expected = _train("cpu", name)
    sim.reset_counters()
    got = _train(dev, name)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {} and counters["refused"] == {}, counters
    assert any(op.startswith("aten::_foreach_") for op in counters["fixed"]), counters["fixed"]
    for value, cpu_value in zip(got, expected):
        assert torch.allclose(value, cpu_value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["SGD nesterov", "Adam"])
def test_without_dmlpatch_every_step_falls_back(dev: torch.device, name: str) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        _train(dev, name)
        fallbacks = sim.counters()["ops"]["fallback"]
    assert "aten::_foreach_norm.Scalar" in fallbacks  # clip_grad_norm_
    assert any(op.startswith(("aten::_foreach_mul_", "aten::_foreach_lerp_")) for op in fallbacks)


def test_without_dmlpatch_fused_steps_fall_back(dev: torch.device) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        _train(dev, "AdamW fused")
        fallbacks = sim.counters()["ops"]["fallback"]
    assert fallbacks["aten::_fused_adamw_"] == 3, fallbacks


def _sample(argument: Any, base: str) -> Any:
    """A value for one schema argument: lists of three tensors of different shapes."""
    kind = str(argument.type)
    positive = base in ("sqrt", "rsqrt", "log", "pow", "reciprocal", "div")
    make = (lambda *s: torch.rand(*s) + 0.5) if positive else torch.randn
    if argument.name == "out":
        return None
    if kind == "List[Tensor]":
        return [make(2, 3), make(4), make(1)]
    if kind in ("List[number]", "List[float]", "List[Scalar]"):
        return [0.5, 1.5, 2.0]
    if argument.name == "scalars":
        return torch.tensor([0.5, 1.5, 2.0])
    if kind == "Tensor":
        return torch.tensor(0.75)
    if kind in ("number", "Scalar", "float"):
        return 2.0 if argument.name == "ord" else 0.75
    if kind == "bool":
        return False
    return None  # optional arguments: their defaults


def _call(kernel_name: str, device: Any) -> list[torch.Tensor]:
    name, _, overload = kernel_name.partition(".")
    schema = torch._C._get_schema("aten::" + name, overload)
    base = name[len("_foreach_") :].rstrip("_")
    torch.manual_seed(1)
    args, kwargs, lists = [], {}, []
    for argument in schema.arguments:
        value = _sample(argument, base)
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            value = [t.to(device) for t in value]
            lists.append(value)
        elif isinstance(value, torch.Tensor) and argument.name != "scalars":
            value = value.to(device)
        if argument.name == "out":
            value = [torch.empty(0, device=device) for _ in range(3)]
            lists.append(value)
        if argument.kwarg_only:
            kwargs[argument.name] = value
        elif value is not None or not argument.has_default_value():
            args.append(value)
    op = getattr(getattr(torch.ops.aten, name), overload or "default")
    result = op(*args, **kwargs)
    returned = result if isinstance(result, (list, tuple)) else []
    # In-place and out= variants write into their first / out list: compare every list.
    return [t.cpu() for t in [*returned, *(t for group in lists for t in group)]]


@pytest.mark.parametrize("kernel_name", sorted(k.name for k in foreach.KERNELS))
def test_every_foreach_kernel_equals_the_cpu(dev: torch.device, kernel_name: str) -> None:
    expected = _call(kernel_name, "cpu")
    sim.reset_counters()
    got = _call(kernel_name, dev)
    counters = sim.counters()["ops"]
    # Per-tensor operators DirectML lacks (clamp_max with a tensor...) are gaps of their own.
    assert not any(op.startswith("aten::_foreach_") for op in counters["fallback"]), counters
    assert counters["fixed"].get("aten::" + kernel_name) == 1, counters["fixed"]
    assert len(got) == len(expected)
    for value, cpu_value in zip(got, expected):
        assert value.shape == cpu_value.shape and value.dtype == cpu_value.dtype
        assert torch.allclose(value, cpu_value, rtol=1e-5, atol=1e-6, equal_nan=True)
