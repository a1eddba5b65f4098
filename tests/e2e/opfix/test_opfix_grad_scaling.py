"""GradScaler's operators on the device: ``_amp_foreach_non_finite_check_and_unscale_`` and
``_amp_update_scale_``, which torch-directml lacks, so that without dmlpatch every step of a
mixed-precision loop copies each gradient through the CPU. Each equals the CPU's kernel bit for
bit (a NaN is a NaN: its payload is the device's), runs with no fallback and no read-back, and
costs what its fix states; a whole ``GradScaler`` loop on the device equals the same loop on
the CPU loss by loss, with the one read-back per step that torch's scaler itself makes."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple, Optional, Union

import pytest
import torch
from tests.e2e.opfix.helpers import without_fixes

import dmlpatch.sim as sim
from dmlpatch.costs import choice, profiles, simulated
from dmlpatch.opfix.optimizers import grad_scaling
from dmlpatch.placement import fallbacks
from dmlpatch.sim import counting

UNSCALE = "aten::_amp_foreach_non_finite_check_and_unscale_"
UPDATE = "aten::_amp_update_scale_"
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16}


@pytest.fixture(autouse=True)
def _said_again() -> Iterator[None]:
    """DirectML's fallback warning is said once per operator and process: the fallbacks here
    must not keep the tests after these from seeing their own."""
    said = set(fallbacks._warned)
    yield
    fallbacks._warned.intersection_update(said)


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same dtype, shape and bits, but that a NaN equals a NaN of any payload."""
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    nan = want.isnan()
    if not torch.equal(got.isnan(), nan):
        return False
    bits = _BITS[want.dtype]
    return torch.equal(got[~nan].view(bits), want[~nan].view(bits))


def _no_fallback() -> dict[str, Any]:
    ops = sim.counters()["ops"]
    assert ops["fallback"] == {} and ops["refused"] == {}, ops
    return dict(ops)


# ---- the check and unscale ----


def _grads(dtype: torch.dtype, poison: Optional[float], scale: float = 1.0) -> list[torch.Tensor]:
    """Gradients of several sizes and layouts: a matrix, a vector, a 0-dim one, an empty one, a
    transposed and a strided view; ``poison`` written into the vector."""
    torch.manual_seed(0)
    grads = [
        torch.randn(33, 17) * scale,
        torch.randn(1000) * scale,
        torch.randn(()) * scale,
        torch.randn(0, 4),
        torch.randn(6, 9).t() * scale,
        (torch.randn(40) * scale)[::3],
    ]
    grads = [grad.to(dtype) for grad in grads]
    if poison is not None:
        grads[1][500] = poison
    return grads


def _on_device(tensors: list[torch.Tensor], dev: Union[str, torch.device]) -> list[torch.Tensor]:
    """Copies with the same strides (a strided view stays one, where ``clone`` packs it)."""
    copies = []
    for tensor in tensors:
        base = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=dev)
        copies.append(base.copy_(tensor))
    return copies


def _unscale_both(
    dev: torch.device,
    grads: list[torch.Tensor],
    inv_scale: float,
    found: float = 0.0,
    shape: tuple[int, ...] = (),
) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """The CPU's call and the device's on equal copies: (CPU grads, CPU found_inf, device
    grads, device found_inf); the device's counted alone."""
    cpu_grads = _on_device(grads, "cpu")
    cpu_found = torch.full(shape, found)
    cpu_inv = torch.full(shape, inv_scale)
    torch._amp_foreach_non_finite_check_and_unscale_(cpu_grads, cpu_found, cpu_inv)
    dev_grads = _on_device(grads, dev)
    dev_found, dev_inv = torch.full(shape, found).to(dev), torch.full(shape, inv_scale).to(dev)
    sim.reset_counters()
    with warnings.catch_warnings():
        # torch 2.4's CPU mse kernel says once that it runs float16 slowly: the simulator's.
        warnings.filterwarnings("ignore", "Applying the CPU mse kernel")
        torch._amp_foreach_non_finite_check_and_unscale_(dev_grads, dev_found, dev_inv)
    return cpu_grads, cpu_found, dev_grads, dev_found


POISONS: dict[str, Optional[float]] = {
    "finite": None,
    "inf": math.inf,
    "-inf": -math.inf,
    "nan": math.nan,
}


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
def test_the_check_and_unscale_equals_the_cpu(
    dev: torch.device, dtype: torch.dtype, poison: str
) -> None:
    grads = _grads(dtype, POISONS[poison], scale=300.0)
    cpu_grads, cpu_found, dev_grads, dev_found = _unscale_both(dev, grads, 1 / 1024)
    ops = _no_fallback()
    assert ops["fixed"] == {UNSCALE: 1}
    assert sim.counters()["syncs"] == 0
    assert float(cpu_found) == (0.0 if poison == "finite" else 1.0)
    assert _same_bits(dev_found, cpu_found)
    for got, want in zip(dev_grads, cpu_grads):
        assert got.stride() == want.stride()
        assert _same_bits(got, want)


def test_float16_gradients_are_unscaled_in_float32(dev: torch.device) -> None:
    """A scale of 2**25 (grown over a long run): its inverse is 0 in float16, so a factor rounded
    to float16 first would zero every gradient; the CPU multiplies in float32, as CUDA does.
    (The simulator's CPU kernel keeps a 0-dim factor in float32 too; DirectML's need not, hence
    the kernel's one-element factor.)"""
    grads = [(torch.randn(257) * 2.0**20).half()]
    cpu_grads, _, dev_grads, _ = _unscale_both(dev, grads, 2.0**-25)
    assert cpu_grads[0].count_nonzero() > 200
    assert _same_bits(dev_grads[0], cpu_grads[0])


def test_found_inf_is_only_ever_set(dev: torch.device) -> None:
    """found_inf already 1 stays 1 for finite gradients (GradScaler sums the devices' flags)."""
    cpu_grads, cpu_found, dev_grads, dev_found = _unscale_both(
        dev, _grads(torch.float32, None), 0.5, found=1.0, shape=(1,)
    )
    assert float(cpu_found) == 1.0 and _same_bits(dev_found, cpu_found)
    assert all(_same_bits(got, want) for got, want in zip(dev_grads, cpu_grads))


def test_the_check_reads_the_gradients_before_they_are_unscaled(dev: torch.device) -> None:
    """A factor above 1 (a scale backed off below 1) overflows a large finite gradient to inf:
    CUDA checks the value it was given, finite, and finds nothing; so does the device."""
    grads = [torch.tensor([3e38, 1.0, -2e38])]
    cpu_grads, cpu_found, dev_grads, dev_found = _unscale_both(dev, grads, 4.0)
    assert float(cpu_found) == 0.0 and math.isinf(float(cpu_grads[0][0]))
    assert _same_bits(dev_found, cpu_found) and _same_bits(dev_grads[0], cpu_grads[0])


def test_an_empty_list_does_nothing_and_checks_nothing(dev: torch.device) -> None:
    # found_inf of the wrong dtype: the CPU kernel returns before its checks for no gradients.
    found = torch.zeros((), dtype=torch.int64)
    torch._amp_foreach_non_finite_check_and_unscale_([], found, torch.ones(()))
    found, inv = found.to(dev), torch.ones((), device=dev)
    sim.reset_counters()
    torch._amp_foreach_non_finite_check_and_unscale_([], found, inv)
    assert simulated.priced().launches == 0 and int(found.cpu()) == 0
    _no_fallback()


def test_the_functional_form_is_served_too(dev: torch.device) -> None:
    grads = _grads(torch.float32, math.inf)
    functional = torch.ops.aten._amp_foreach_non_finite_check_and_unscale
    want, want_found = functional(grads, torch.zeros(()), torch.full((), 0.25))
    on_device = _on_device(grads, dev)
    sim.reset_counters()
    got, got_found = functional(
        on_device, torch.zeros((), device=dev), torch.full((), 0.25, device=dev)
    )
    _no_fallback()
    assert _same_bits(got_found, want_found)
    assert all(_same_bits(g, w) for g, w in zip(got, want))


def _cpu_error(call: Callable[[], Any]) -> str:
    with pytest.raises(RuntimeError) as caught:
        call()
    return re.escape(str(caught.value).replace("CPU", "privateuseone"))


def test_bad_arguments_are_refused_as_on_the_cpu(dev: torch.device) -> None:
    grads = [torch.ones(3)]
    for found, inv in (
        (torch.zeros((), dtype=torch.float64), torch.ones(())),
        (torch.zeros(()), torch.ones(2)),
        (torch.zeros(2), torch.ones(())),
    ):
        expected = _cpu_error(
            lambda found=found, inv=inv: torch._amp_foreach_non_finite_check_and_unscale_(
                grads, found, inv
            )
        )
        on_device = [grad.to(dev) for grad in grads]
        with pytest.raises(RuntimeError, match=expected):
            torch._amp_foreach_non_finite_check_and_unscale_(on_device, found.to(dev), inv.to(dev))
    scale, tracker, found = torch.ones(()), torch.zeros((), dtype=torch.int64), torch.zeros(())
    expected = _cpu_error(lambda: torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 3))
    with pytest.raises(RuntimeError, match=expected):
        torch._amp_update_scale_(scale.to(dev), tracker.to(dev), found.to(dev), 2.0, 0.5, 3)


# ---- the update ----


class Update(NamedTuple):
    scale: float
    tracker: int
    found: float
    growth: float = 2.0
    backoff: float = 0.5
    interval: int = 3


UPDATES = {
    "counts a success": Update(65536.0, 0, 0.0),
    "grows at the interval": Update(65536.0, 2, 0.0),
    "grows every step": Update(1024.0, 0, 0.0, interval=1),
    "backs off": Update(65536.0, 1, 1.0),
    "backs off at the interval": Update(65536.0, 2, 1.0),
    "a NaN found_inf is found": Update(65536.0, 2, math.nan),
    "a sum of found_infs is found": Update(65536.0, 0, 2.0),
    "does not grow past float32": Update(3e38, 2, 0.0),
    "does not grow a NaN scale": Update(math.nan, 2, 0.0),
    "factors float32 cannot hold": Update(1.1, 2, 0.0, growth=1.3, backoff=0.3),
    "backs off by a factor float32 cannot hold": Update(1.1, 2, 1.0, growth=1.3, backoff=0.3),
    "an interval beyond int32": Update(8.0, 5, 0.0, interval=2**40),
    "an interval beyond int32, found": Update(8.0, 5, 1.0, interval=2**40),
}


@pytest.mark.parametrize("shape", [(), (1,)], ids=["0-dim", "1-element"])
@pytest.mark.parametrize("name", sorted(UPDATES))
def test_the_update_equals_the_cpu(dev: torch.device, name: str, shape: tuple[int, ...]) -> None:
    case = UPDATES[name]
    cpu = (
        torch.full(shape, case.scale),
        torch.full(shape, case.tracker, dtype=torch.int32),
        torch.full(shape, case.found),
    )
    on_device = tuple(tensor.to(dev) for tensor in cpu)
    factors = (case.growth, case.backoff, case.interval)
    torch._amp_update_scale_(*cpu, *factors)
    sim.reset_counters()
    returned = torch._amp_update_scale_(*on_device, *factors)
    assert _no_fallback()["fixed"] == {UPDATE: 1}
    assert sim.counters()["syncs"] == 0
    assert returned.data_ptr() == on_device[0].data_ptr()
    assert _same_bits(on_device[0], cpu[0]), (on_device[0].cpu(), cpu[0])
    assert torch.equal(on_device[1].cpu(), cpu[1])
    assert torch.equal(on_device[2].cpu().isnan(), cpu[2].isnan())  # found_inf is not written


# ---- costs ----

UNSCALE_SHAPES = {"one gradient": (1, 10), "a small model": (4, 1000), "many": (50, 4096)}


@pytest.mark.usefixtures("composed")
@pytest.mark.parametrize("name", sorted(UNSCALE_SHAPES))
def test_the_check_costs_what_its_fix_says(dev: torch.device, name: str) -> None:
    count, size = UNSCALE_SHAPES[name]
    grads = [torch.randn(size, device=dev) for _ in range(count)]
    found, inv = torch.zeros((), device=dev), torch.full((), 0.5, device=dev)
    sim.reset_counters()
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    counted = simulated.priced()
    stated = grad_scaling.unscale_cost(grads, found, inv)
    assert counted.launches == stated.device.launches == 2 * count + (2 if count > 1 else 0) + 2
    assert counted.readbacks == stated.device.readbacks == 0
    spent = sum(entry["bytes"] for entry in counting.costs().values())
    assert spent / 2 <= stated.device.bytes <= spent * 2, (stated.device.bytes, spent)
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        fell_back = simulated.priced()
        down = sum(entry["readback_bytes"] for entry in counting.costs().values())
    assert fell_back.readbacks == stated.fallback.arguments == count + 2
    assert down == stated.fallback.down_bytes


@pytest.mark.usefixtures("composed")
@pytest.mark.parametrize("name", sorted(UPDATES))
def test_the_update_costs_what_its_fix_says(dev: torch.device, name: str) -> None:
    case = UPDATES[name]
    scale = torch.full((), case.scale, device=dev)
    tracker = torch.full((), case.tracker, dtype=torch.int32, device=dev)
    found = torch.full((), case.found, device=dev)
    arguments = (scale, tracker, found, case.growth, case.backoff, case.interval)
    sim.reset_counters()
    torch._amp_update_scale_(*arguments)
    counted = simulated.priced()
    stated = grad_scaling.update_cost(*arguments)
    assert counted.launches == stated.device.launches
    assert counted.readbacks == stated.device.readbacks == 0
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        torch._amp_update_scale_(*arguments)
        assert simulated.priced().readbacks == stated.fallback.arguments == 3


@pytest.mark.parametrize("profile", sorted(profiles.SHIPPED))
def test_the_compositions_are_cheaper_on_every_shipped_profile(
    dev: torch.device, profile: str
) -> None:
    """From one small gradient to a large model's (a 50M-element embedding among them): the
    fallback reads each gradient back and copies it both ways over the bus, the composition
    passes over it three times in the device's memory."""
    chosen = profiles.SHIPPED[profile]
    found, inv = torch.zeros((), device=dev), torch.full((), 0.5, device=dev)
    for sizes in ([8], [1000] * 4, [4096] * 200, [50_000_000, 1000]):
        grads = [torch.empty(size, device=dev) for size in sizes]
        costs = grad_scaling.unscale_cost(grads, found, inv)
        on_device = choice.device_seconds(costs.device, chosen)
        assert on_device < choice.fallback_seconds(costs.fallback, chosen), sizes
    scale, tracker = torch.ones((), device=dev), torch.zeros((), dtype=torch.int32, device=dev)
    for growth, backoff in ((2.0, 0.5), (1.3, 0.3)):
        costs = grad_scaling.update_cost(scale, tracker, found, growth, backoff, 2000)
        on_device = choice.device_seconds(costs.device, chosen)
        assert on_device < choice.fallback_seconds(costs.fallback, chosen)


def test_without_dmlpatch_both_operators_fall_back(dev: torch.device) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = _train(dev, steps=2)
    for fell_back in run.fallbacks:
        assert fell_back.get(UNSCALE) == 1 and fell_back.get(UPDATE) == 1, fell_back


# ---- a GradScaler loop ----


class Run(NamedTuple):
    losses: list[float]
    scales: list[float]
    parameters: list[torch.Tensor]
    state: dict[str, Any]
    #: Per step: the modelled launches and read-backs of the device (none on the CPU).
    launches: list[int]
    readbacks: list[int]
    fallbacks: list[dict[str, int]]


def _model(device: Union[str, torch.device]) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model.to(device)


def _train(
    device: Union[str, torch.device],
    steps: int = 6,
    *,
    fused: bool = False,
    poisoned_step: Optional[int] = None,
    state: Optional[dict[str, Any]] = None,
    model: Optional[torch.nn.Module] = None,
) -> Run:
    """A float32 regression with ``torch.amp.GradScaler`` (growth every 2 steps); at
    ``poisoned_step`` a hook makes the first layer's weight gradient infinite."""
    kind = torch.device(device).type
    model = model if model is not None else _model(device)
    parameters = list(model.parameters())
    optimizer: torch.optim.Optimizer = (
        torch.optim.Adam(parameters, lr=0.01, fused=True)
        if fused
        else torch.optim.SGD(parameters, lr=0.05, momentum=0.9)
    )
    scaler = torch.amp.GradScaler(kind, init_scale=2.0**10, growth_interval=2)
    if state is not None:
        scaler.load_state_dict(state)
    data = torch.Generator().manual_seed(1)
    run = Run([], [], [], {}, [], [], [])
    for step in range(steps):
        x, y = torch.randn(5, 4, generator=data), torch.randn(5, 2, generator=data)
        x, y = x.to(device), y.to(device)
        sim.reset_counters()
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        hook = None
        if step == poisoned_step:
            hook = model[0].weight.register_hook(lambda grad: grad * math.inf)
        scaler.scale(loss).backward()
        if hook is not None:
            hook.remove()
        scaler.step(optimizer)
        scaler.update()
        if kind != "cpu":
            priced = simulated.priced()
            run.launches.append(priced.launches)
            run.readbacks.append(priced.readbacks)
            run.fallbacks.append(dict(sim.counters()["ops"]["fallback"]))
        run.losses.append(loss.item())
        run.scales.append(scaler.get_scale())
    run.parameters.extend(p.detach().cpu() for p in parameters)
    run.state.update(scaler.state_dict())
    return run


def test_a_grad_scaler_loop_equals_the_cpu_s(dev: torch.device) -> None:
    expected, got = _train("cpu"), _train(dev)
    assert got.losses == expected.losses
    assert got.scales == expected.scales == [2.0**10, 2.0**11, 2.0**11, 2.0**12, 2.0**12, 2.0**13]
    assert all(torch.equal(a, b) for a, b in zip(got.parameters, expected.parameters))
    assert got.state == expected.state
    assert got.fallbacks == [{}] * len(got.fallbacks)
    # torch's scaler reads found_inf back once a step (_maybe_opt_step's .item()), and no more.
    assert got.readbacks == [1] * len(got.readbacks)


def test_a_step_with_an_infinite_gradient_is_skipped_and_the_scale_halves(
    dev: torch.device,
) -> None:
    expected, got = _train("cpu", poisoned_step=2), _train(dev, poisoned_step=2)
    assert got.scales == expected.scales == [2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**11, 2.0**11]
    assert got.losses == expected.losses
    assert all(torch.equal(a, b) for a, b in zip(got.parameters, expected.parameters))
    assert got.fallbacks == [{}] * len(got.fallbacks)
    # The skipped step reads back as many times as the others: found_inf, once.
    assert got.readbacks == [1] * len(got.readbacks)


def test_the_scaler_s_state_round_trips(dev: torch.device) -> None:
    """state_dict after three steps, loaded into a new scaler that trains on: as on the CPU."""
    cpu_model, dev_model = _model("cpu"), _model(dev)
    first_cpu, first_dev = _train("cpu", 3, model=cpu_model), _train(dev, 3, model=dev_model)
    assert first_dev.state == first_cpu.state and first_dev.state["_growth_tracker"] == 1
    then_cpu = _train("cpu", 3, state=first_cpu.state, model=cpu_model)
    then_dev = _train(dev, 3, state=first_dev.state, model=dev_model)
    assert then_dev.scales == then_cpu.scales and then_dev.state == then_cpu.state
    assert then_dev.losses == then_cpu.losses


def test_a_grad_scaler_over_a_fused_adam(dev: torch.device) -> None:
    """The fused step takes the scale and found_inf from the scaler (which checks the
    gradients with an inverse scale of 1) and unscales them itself."""
    for poisoned in (None, 1):
        expected = _train("cpu", 4, fused=True, poisoned_step=poisoned)
        got = _train(dev, 4, fused=True, poisoned_step=poisoned)
        assert got.scales == expected.scales
        assert got.losses == pytest.approx(expected.losses, rel=1e-5)
        for value, cpu_value in zip(got.parameters, expected.parameters):
            assert torch.allclose(value, cpu_value, rtol=1e-5, atol=1e-6)
        assert got.fallbacks == [{}] * len(got.fallbacks)
