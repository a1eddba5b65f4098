"""bfloat16 on the device (``dmlpatch.opfix.dtype_policy``): every way a bfloat16 tensor
arrives holds it as float32 (or float16 when asked), with the values a CPU gets from the same
weights in that dtype; without dmlpatch each way stops with DirectML's ``Invalid or
unsupported data type BFloat16.``."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import Callable

import pytest
import torch
from tests.e2e.opfix.helpers import without_fixes

import dmlpatch.sim as sim
from dmlpatch import environment_variables
from dmlpatch.errors import UsageError
from dmlpatch.gaps import bf16_setting
from dmlpatch.opfix import dtype_policy


def _weights() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(4, 6).bfloat16()


ARRIVALS: dict[str, Callable[[torch.Tensor, torch.device], torch.Tensor]] = {
    ".to(device)": lambda w, d: w.to(d),
    ".to(device, bfloat16)": lambda w, d: w.float().to(d, torch.bfloat16),
    ".to(device=, dtype=)": lambda w, d: w.to(device=d, dtype=torch.bfloat16),
    "device tensor .to(bfloat16)": lambda w, d: w.float().to(d).to(torch.bfloat16),
    "device tensor .bfloat16()": lambda w, d: w.float().to(d).bfloat16(),
    "tensor(..., dtype, device)": lambda w, d: torch.tensor(
        w.float().tolist(), dtype=w.dtype, device=d
    ),
    "as_tensor": lambda w, d: torch.as_tensor(w, device=d),
    "module .to(device)": lambda w, d: _linear(w).to(d).weight.data,
    "module .bfloat16() on the device": lambda w, d: (
        _linear(w.float()).to(d).bfloat16().weight.data
    ),
    "module .to(device, bfloat16)": lambda w, d: (
        _linear(w.float()).to(d, torch.bfloat16).weight.data
    ),
    "copy_ into a device parameter": lambda w, d: torch.empty(4, 6, device=d).copy_(w),
    "load_state_dict": lambda w, d: _loaded(w, d),
}


def _linear(w: torch.Tensor) -> torch.nn.Linear:
    layer = torch.nn.Linear(6, 4, bias=False, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
    return layer


def _loaded(w: torch.Tensor, d: torch.device) -> torch.Tensor:
    layer = torch.nn.Linear(6, 4, bias=False).to(d)
    layer.load_state_dict({"weight": w})
    return layer.weight.data


@pytest.fixture
def float16_policy(dev: torch.device) -> Iterator[None]:
    os.environ[environment_variables.DMLPATCH_BF16] = "float16"
    previous = dtype_policy.current()
    assert previous is not None
    dtype_policy.configure(frozenset({"BFloat16"}), previous.float64_everywhere)
    yield
    del os.environ[environment_variables.DMLPATCH_BF16]
    dtype_policy._current = previous


@pytest.mark.parametrize("way", ARRIVALS)
def test_bfloat16_arrives_as_float32_with_its_values(dev: torch.device, way: str) -> None:
    w = _weights()
    got = ARRIVALS[way](w, dev)
    assert got.device == dev and got.dtype == torch.float32
    assert torch.equal(got.cpu(), w.float())  # every bfloat16 value is a float32 one


@pytest.mark.parametrize("way", [".to(device)", "module .to(device)", "load_state_dict"])
def test_bfloat16_arrives_as_float16_when_asked(
    dev: torch.device, float16_policy: None, way: str
) -> None:
    w = _weights()
    got = ARRIVALS[way](w, dev)
    expected = torch.float32 if way == "load_state_dict" else torch.float16
    assert got.device == dev and got.dtype == expected
    assert torch.equal(got.cpu(), w.to(expected))


FACTORIES: dict[str, Callable[[torch.device], torch.Tensor]] = {
    "zeros": lambda d: torch.zeros(2, 3, dtype=torch.bfloat16, device=d),
    "ones": lambda d: torch.ones(5, dtype=torch.bfloat16, device=d),
    "full": lambda d: torch.full((2,), 1.5, dtype=torch.bfloat16, device=d),
    "empty": lambda d: torch.empty(3, dtype=torch.bfloat16, device=d).fill_(2),
    "arange": lambda d: torch.arange(4, dtype=torch.bfloat16, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, dtype=torch.bfloat16, device=d),
    "new_zeros": lambda d: torch.ones(1, device=d).new_zeros(2, dtype=torch.bfloat16),
    "eye": lambda d: torch.eye(3, dtype=torch.bfloat16, device=d),
}


@pytest.mark.parametrize("name", FACTORIES)
def test_bfloat16_factories_on_the_device(dev: torch.device, name: str) -> None:
    got = FACTORIES[name](dev)
    expected = FACTORIES[name](torch.device("cpu"))
    assert got.dtype == torch.float32 and torch.equal(got.cpu(), expected.float())


@pytest.mark.parametrize("shape", [(2, 3, 4), (5, 0, 3), (1, 1, 1, 7), (2, 3, 0, 4, 5)])
def test_allocations_of_plain_dtypes_are_contiguous_like_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...]
) -> None:
    """Their strides are remembered by shape after the first: the second allocation of each
    shape takes that path."""
    for _ in range(2):
        for dtype in (torch.float32, torch.int64):
            got = torch.empty(shape, dtype=dtype, device=dev)
            assert (got.shape, got.stride(), got.dtype) == (
                shape,
                torch.empty(shape).stride(),
                dtype,
            )
            assert got.is_contiguous()


def test_code_branching_on_the_dtype_takes_the_float32_branch(dev: torch.device) -> None:
    """What bfloat16-aware code reads: the dtype that is there."""
    layer = _linear(_weights()).to(dev)
    dtype = next(layer.parameters()).dtype
    assert dtype == torch.float32 and torch.finfo(dtype).min == torch.finfo(torch.float32).min
    x = torch.randn(2, 6).to(dev, dtype)
    assert layer(x).dtype == torch.float32


def test_torch_load_of_a_bfloat16_checkpoint_onto_the_device(dev: torch.device) -> None:
    """Storages arrive as bytes; tensors that shared one (tied weights, a view) share one."""
    w = _weights()
    saved = {"weight": w, "tied": w, "row": w[1], "bias": torch.randn(4).bfloat16()}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    for location in (dev, "privateuseone:0", lambda storage, where: storage.privateuseone(0)):
        buffer.seek(0)
        loaded = torch.load(buffer, map_location=location, weights_only=True)
        for key, value in saved.items():
            assert loaded[key].device == dev and loaded[key].dtype == torch.float32, key
            assert torch.equal(loaded[key].cpu(), value.float()), key
        assert loaded["tied"].data_ptr() == loaded["weight"].data_ptr()
        assert (
            loaded["row"].untyped_storage().data_ptr()
            == loaded["weight"].untyped_storage().data_ptr()
        )


def test_complex_checkpoints_load_onto_the_device(dev: torch.device) -> None:
    z = torch.randn(3, 2, dtype=torch.complex64)
    buffer = io.BytesIO()
    torch.save({"z": z}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location=dev)
    assert loaded["z"].is_complex() and loaded["z"].device == dev
    assert torch.equal(loaded["z"].cpu(), z)


def test_without_dmlpatch_bfloat16_stops_the_process(dev: torch.device) -> None:
    w = _weights()
    with without_fixes():
        for attempt in (
            lambda: w.to(dev),
            lambda: torch.zeros(2, dtype=torch.bfloat16, device=dev),
            lambda: torch.ones(2).to(dev).bfloat16(),
        ):
            with pytest.raises(RuntimeError, match=r"Invalid or unsupported data type BFloat16\."):
                attempt()


def test_the_policy_is_said_once(dev: torch.device, capfd: pytest.CaptureFixture[str]) -> None:
    from dmlpatch import log

    log._said.discard("dtype-bfloat16")
    _weights().to(dev)
    torch.zeros(1, dtype=torch.bfloat16, device=dev)
    lines = [line for line in capfd.readouterr().err.splitlines() if "bfloat16" in line]
    assert lines == [
        "dmlpatch: bfloat16 runs as float32 on DirectML, which has no bfloat16 (exact: every "
        "bfloat16 value is a float32 one); DMLPATCH_BF16=float16 halves the memory"
    ]


def test_a_bad_bf16_setting_is_one_line() -> None:
    with pytest.raises(UsageError) as raised:
        bf16_setting.parse_bf16("half")
    assert str(raised.value) == (
        "DMLPATCH_BF16='half': bfloat16 runs on DirectML as float32 or float16; choose one of "
        "float32, float16"
    )


def test_float64_stays_where_the_adapter_has_it(dev: torch.device) -> None:
    assert sim.has_float64()
    got = torch.arange(3, dtype=torch.float64).to(dev)
    assert got.dtype == torch.float64
