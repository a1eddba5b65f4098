"""``torch.linalg.matrix_exp`` on the device (scaling and squaring of a Taylor polynomial):
torch-directml has no kernel for it, so without dmlpatch each call copies through the CPU, and
``nn.utils.parametrizations.orthogonal`` does on every forward pass. With it the exponential
and its gradient equal the CPU's at every scale, and orthogonal layers train step for step as
on the CPU without a copy."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import as_accurate, close, without_fixes

import dmlpatch.sim as sim
from dmlpatch.opfix.linalg import exponential

# What these tests check is the composition: the cost model would send most of these calls
# through the fallback.
pytestmark = pytest.mark.usefixtures("composed")


def test_without_dmlpatch_matrix_exp_falls_back(dev: torch.device) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        torch.linalg.matrix_exp(torch.randn(4, 4, device=dev))
        fallbacks = sim.counters()["ops"]["fallback"]
    assert "aten::linalg_matrix_exp" in fallbacks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [0.0, 0.1, 1.0, 5.0])
@pytest.mark.parametrize("shape", [(1, 1), (3, 6, 6), (32, 32)])
def test_matrix_exp_and_its_gradient_equal_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], scale: float, dtype: torch.dtype
) -> None:
    torch.manual_seed(len(shape))
    a = (torch.randn(*shape, dtype=dtype) * scale / shape[-1] ** 0.5).requires_grad_()
    on_device = a.detach().to(dev).requires_grad_()
    weights = torch.randn(shape[-2:], dtype=dtype)
    sim.reset_counters()
    exact = a.detach().double().requires_grad_()
    results = []
    for x, w in ((a, weights), (on_device, weights.to(dev)), (exact, weights.double())):
        result = torch.linalg.matrix_exp(x)
        (result * w).sum().backward()
        results.append(result.detach())
    assert as_accurate(results[1], results[0], results[2])
    assert on_device.grad is not None and a.grad is not None and exact.grad is not None
    assert as_accurate(on_device.grad, a.grad, exact.grad)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {}
    # The forward and its gradient (the float64 reference ran on the CPU).
    assert counters["fixed"] == {"aten::linalg_matrix_exp": 2}


def test_orthogonal_layers_train_as_on_the_cpu(dev: torch.device) -> None:
    # A square weight takes the matrix_exp map, a non-square one the Householder map; five
    # SGD steps compared loss by loss, and the weights stay orthogonal on the device.
    losses = {}
    layers = {}
    for where in (torch.device("cpu"), dev):
        torch.manual_seed(0)
        square = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(8, 8))
        wide = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(8, 5))
        model = torch.nn.Sequential(square, torch.nn.Tanh(), wide).to(where)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 8).to(where), torch.randn(16, 5).to(where)
        losses[where.type] = []
        for _ in range(5):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[where.type].append(loss.item())
        layers[where.type] = square
    assert torch.allclose(
        torch.tensor(losses[dev.type]), torch.tensor(losses["cpu"]), rtol=1e-5, atol=1e-6
    )
    assert losses["cpu"][-1] < losses["cpu"][0]
    weight = layers[dev.type].weight.detach().cpu()
    assert close(weight @ weight.mT, torch.eye(8))
    sim.reset_counters()
    layers[dev.type].weight.sum().backward()
    assert sim.counters()["ops"]["fallback"] == {}


def test_a_non_finite_or_wide_matrix_goes_through_the_cpu(dev: torch.device) -> None:
    wide = torch.randn(exponential.WIDEST + 1, exponential.WIDEST + 1) * 0.01
    broken = torch.randn(3, 3)
    broken[0, 1] = float("inf")
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a in (wide, broken):
            assert close(torch.linalg.matrix_exp(a.to(dev)), torch.linalg.matrix_exp(a))
    assert sim.counters()["ops"]["fallback"] == {"aten::linalg_matrix_exp": 2}
