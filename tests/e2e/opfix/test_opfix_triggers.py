"""Fixes that wait for their trigger (``dmlpatch.opfix.triggers``): products and sums are
DirectML's own, with no Python call in front, until a bool (uint8) tensor first exists on the
device; every way such a tensor can come to exist there installs the fix before it can be
used, so ``x * mask`` and uint8 sums still equal the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Callable

import pytest
import torch
from tests.e2e.opfix.helpers import PROFILE

import dmlpatch.sim as sim
from dmlpatch import opfix
from dmlpatch.opfix import installer, sentinels, triggers


@pytest.fixture
def fresh(dev: torch.device) -> Iterator[torch.device]:
    """The fixes installed anew: nothing has fired yet."""
    opfix.uninstall()
    opfix.install("sim", PROFILE)
    yield dev


def test_products_and_sums_are_directmls_own_until_a_trigger(fresh: torch.device) -> None:
    x, y = torch.randn(4, 3).to(fresh), torch.randn(4, 3).to(fresh)
    sim.reset_counters()
    (x * y).sum(0)
    x.mul_(2)
    (x + y).mean()
    x.to(torch.float16)
    assert triggers.waiting_for(torch.bool) and triggers.waiting_for(torch.uint8)
    assert installer._triggered == []
    fixed = sim.counters()["ops"]["fixed"]
    assert "aten::mul.out" not in fixed and "aten::sum.IntList_out" not in fixed


BOOL_BIRTHS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x > 0": lambda x: x > 0,
    "x == x": lambda x: x == x,
    "x != 0": lambda x: x != 0,
    "x < y": lambda x: x < x.flip(0),
    "x <= 0": lambda x: x <= 0,
    "x >= 0": lambda x: x >= 0,
    "isnan": lambda x: ~torch.isnan(x),
    "isinf": lambda x: ~torch.isinf(x),
    "isfinite": torch.isfinite,
    "isposinf": lambda x: ~torch.isposinf(x),
    "signbit": torch.signbit,
    "isin": lambda x: torch.isin(x, x[:2]),
    "any": lambda x: (x.abs() + 1).bool().any(1, keepdim=True),
    "all": lambda x: torch.all(x == x, 1, keepdim=True),
    "logical_not": lambda x: torch.logical_not(x),
    "logical_and": lambda x: torch.logical_and(x, x),
    "x.bool()": lambda x: x.bool(),
    "x.to(bool)": lambda x: x.to(torch.bool),
    "host mask .to(device)": lambda x: (x.cpu() > 0).to(x.device),
    "ones(dtype=bool)": lambda x: torch.ones(x.shape, dtype=torch.bool, device=x.device),
    "new_ones(dtype=bool)": lambda x: x.new_ones(x.shape, dtype=torch.bool),
    "zeros_like(dtype=bool)": lambda x: ~torch.zeros_like(x, dtype=torch.bool),
    "ones_like(dtype=bool)": lambda x: torch.ones_like(x, dtype=torch.bool),
    "full_like(True)": lambda x: torch.full_like(x, True, dtype=torch.bool),
    "tensor(device=)": lambda x: torch.tensor([[True], [False], [True], [True]], device=x.device),
    "triu of ones": lambda x: torch.ones(4, 3, dtype=torch.bool, device=x.device).triu(),
}


@pytest.mark.parametrize("way", BOOL_BIRTHS)
def test_every_way_a_bool_tensor_is_born_installs_the_fix(fresh: torch.device, way: str) -> None:
    make = BOOL_BIRTHS[way]
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    on_device = x.to(fresh)
    mask = make(on_device)
    assert mask.dtype == torch.bool and mask.device == fresh
    expected_mask = make(x)
    product = on_device * mask
    assert product.dtype == torch.float32
    assert torch.equal(product.cpu(), x * expected_mask)
    in_place = on_device.clone()
    in_place *= mask
    assert in_place.dtype == torch.float32 and torch.equal(in_place.cpu(), x * expected_mask)


UINT8_BIRTHS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "host tensor .to(device)": lambda x: x.cpu().to(torch.uint8).to(x.device),
    "x.to(uint8)": lambda x: x.to(torch.uint8),
    "x.byte()": lambda x: x.byte(),
    "zeros(dtype=uint8) + x": lambda x: (
        torch.zeros(x.shape, dtype=torch.uint8, device=x.device) + x.byte()
    ),
    "randint(dtype=uint8)": lambda x: torch.randint(
        0, 250, x.shape, dtype=torch.uint8, device=x.device
    ),
    "full_like(dtype=uint8)": lambda x: torch.full_like(x, 200, dtype=torch.uint8),
}


@pytest.mark.parametrize("way", UINT8_BIRTHS)
def test_every_way_a_uint8_tensor_is_born_installs_the_fix(fresh: torch.device, way: str) -> None:
    make = UINT8_BIRTHS[way]
    torch.manual_seed(0)
    x = torch.rand(4, 3) * 200
    values = make(x.to(fresh))
    assert values.dtype == torch.uint8
    expected = make(x) if way != "randint(dtype=uint8)" else values.cpu()
    assert torch.equal(values.sum().cpu(), expected.sum())
    assert torch.equal(values.sum(0).cpu(), expected.sum(0))


def test_the_watchers_stand_aside_once_a_bool_tensor_exists(fresh: torch.device) -> None:
    x = torch.randn(3).to(fresh)
    assert sentinels._library is not None
    mask = x > 0
    assert sentinels._library is None  # retired by the comparison that made the first bool
    x * mask  # the product's fix runs in Python anyway: the retired watchers go there
    assert sentinels._retired is None
    assert not triggers.waiting_for(torch.bool)
