"""``torch.linalg.cholesky``, ``slogdet`` and triangular solves on the device: torch-directml has
no kernel for them, so without dmlpatch each call copies through the CPU, and a
``MultivariateNormal`` does on every ``log_prob``. With it the factors, ``info``, the log
determinants and the solutions equal the CPU's, forward and backward, and a model fitting a
multivariate normal trains step for step as on the CPU without a copy."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import close, no_copies, without_fixes

import dmlpatch.sim as sim
from dmlpatch.opfix.linalg import cholesky

# What these tests check is the composition: the cost model would send most of these calls
# through the fallback.
pytestmark = pytest.mark.usefixtures("composed")

FLOATS = [torch.float32, torch.float64]


def _positive_definite(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    n = shape[-1]
    a = torch.randn(*shape, dtype=dtype)
    return a @ a.mT / n + torch.eye(n, dtype=dtype)


def test_without_dmlpatch_they_fall_back(dev: torch.device) -> None:
    a = _positive_definite(5, 5).to(dev)
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        torch.linalg.cholesky(a)
        torch.linalg.slogdet(a)
        torch.linalg.solve_triangular(a.tril(), a, upper=False)
        torch.cholesky_solve(a, a.tril())
        fallbacks = set(sim.counters()["ops"]["fallback"])
    assert {
        "aten::linalg_cholesky_ex.L",
        "aten::_linalg_slogdet.sign",
        "aten::linalg_solve_triangular",
        "aten::_cholesky_solve_helper",
    } <= fallbacks


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 4, 6, 6), (17, 17), (64, 64)])
def test_cholesky_equals_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], upper: bool, dtype: torch.dtype
) -> None:
    torch.manual_seed(shape[-1])
    a = _positive_definite(*shape, dtype=dtype)
    # LAPACK reads one triangle: the other is noise it must not see.
    noisy = a + (torch.randn_like(a).tril(-1) if upper else torch.randn_like(a).triu(1))
    factor, info = torch.linalg.cholesky_ex(noisy, upper=upper)
    sim.reset_counters()
    got, got_info = torch.linalg.cholesky_ex(noisy.to(dev), upper=upper)
    counters = sim.counters()
    assert close(got, factor) and torch.equal(got_info.cpu(), info)
    assert got.stride() == factor.stride()
    assert no_copies(counters) or counters["transfers"]["h2d"]["count"] == 1  # a's own move
    assert counters["ops"]["fixed"] == {"aten::linalg_cholesky_ex.L": 1}


def test_a_matrix_that_is_not_positive_definite_gets_the_cpu_s_info_and_error(
    dev: torch.device,
) -> None:
    a = _positive_definite(3, 5, 5)
    a[1, 2, 2] = -4.0  # the third leading minor of the second matrix
    a[2, 0, 0] = float("nan")
    _, info = torch.linalg.cholesky_ex(a)
    _, got_info = torch.linalg.cholesky_ex(a.to(dev))
    assert torch.equal(got_info.cpu(), info) and info.tolist() == [0, 3, 1]
    with pytest.raises(RuntimeError) as on_cpu:
        torch.linalg.cholesky(a)
    with pytest.raises(RuntimeError) as on_device:
        torch.linalg.cholesky(a.to(dev))
    assert type(on_device.value) is type(on_cpu.value)
    assert str(on_device.value) == str(on_cpu.value)


@pytest.mark.parametrize("shape", [(4, 4), (2, 12, 12)])
def test_cholesky_gradients_equal_the_cpu_s(dev: torch.device, shape: tuple[int, ...]) -> None:
    torch.manual_seed(2)
    a = _positive_definite(*shape, dtype=torch.float64).requires_grad_()
    on_device = a.detach().to(dev).requires_grad_()
    sim.reset_counters()
    for x in (a, on_device):
        torch.linalg.cholesky(x).sin().sum().backward()
    assert on_device.grad is not None and a.grad is not None
    assert close(on_device.grad, a.grad)
    assert sim.counters()["ops"]["fallback"] == {}


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("b_shape", [(6, 2), (3, 6, 2), (2, 1, 6, 1)])
def test_cholesky_solve_and_its_gradients_equal_the_cpu_s(
    dev: torch.device, b_shape: tuple[int, ...], upper: bool
) -> None:
    torch.manual_seed(len(b_shape))
    factor = torch.linalg.cholesky(_positive_definite(3, 6, 6, dtype=torch.float64), upper=upper)
    factor.requires_grad_()
    b = torch.randn(*b_shape, dtype=torch.float64, requires_grad=True)
    on_device = [t.detach().to(dev).requires_grad_() for t in (b, factor)]
    sim.reset_counters()
    results = []
    for rhs, tril in ((b, factor), on_device):
        x = torch.cholesky_solve(rhs, tril, upper=upper)
        x.sin().sum().backward()
        results.append(x.detach())
    assert close(results[1], results[0])
    for got, expected in zip(on_device, (b, factor)):
        assert got.grad is not None and expected.grad is not None
        assert close(got.grad, expected.grad)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {}
    assert counters["fixed"]["aten::_cholesky_solve_helper"] >= 1


@pytest.mark.parametrize("dtype", FLOATS)
def test_slogdet_equals_the_cpu_s(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    a = torch.randn(4, 5, 5, dtype=dtype)
    a[1] = 0  # singular: sign 0, log|det| -inf
    a[2, 0] *= -1
    sign, logabsdet = torch.linalg.slogdet(a)
    sim.reset_counters()
    got_sign, got_logabsdet = torch.linalg.slogdet(a.to(dev))
    assert close(got_sign, sign) and close(got_logabsdet, logabsdet)
    assert sim.counters()["ops"]["fixed"] == {"aten::_linalg_slogdet.sign": 1}
    x = a[[0, 2, 3]].requires_grad_()
    on_device = x.detach().to(dev).requires_grad_()
    for y in (x, on_device):
        torch.linalg.slogdet(y).logabsdet.sum().backward()
    assert on_device.grad is not None and x.grad is not None
    assert close(on_device.grad, x.grad)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
def test_wide_triangular_systems_are_solved_on_the_device(
    dev: torch.device, upper: bool, left: bool
) -> None:
    torch.manual_seed(4)
    t = torch.linalg.cholesky(_positive_definite(2, 40, 40))
    t = t.mT if upper else t
    b = torch.randn(2, 40, 3) if left else torch.randn(2, 3, 40)
    expected = torch.linalg.solve_triangular(t, b, upper=upper, left=left)
    sim.reset_counters()
    got = torch.linalg.solve_triangular(t.to(dev), b.to(dev), upper=upper, left=left)
    assert close(got, expected)
    assert sim.counters()["ops"]["fixed"] == {"aten::linalg_solve_triangular.out": 1}


def test_a_multivariate_normal_trains_as_on_the_cpu(dev: torch.device) -> None:
    # Fitting a full-covariance Gaussian: scale_tril, log_prob (a triangular solve and the
    # log-diagonal), five Adam steps compared loss by loss.
    torch.manual_seed(5)
    data = torch.randn(256, 10) @ torch.randn(10, 10) + torch.randn(10)
    losses = {}
    for where in (torch.device("cpu"), dev):
        torch.manual_seed(6)
        mean = torch.zeros(10, device=where, requires_grad=True)
        raw = (0.1 * torch.randn(10, 10)).to(where).requires_grad_()
        optimizer = torch.optim.Adam([mean, raw], lr=0.05)
        points = data.to(where)
        losses[where.type] = []
        for _ in range(5):
            covariance = raw @ raw.mT + torch.eye(10, device=where)
            normal = torch.distributions.MultivariateNormal(mean, covariance_matrix=covariance)
            loss = -normal.log_prob(points).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[where.type].append(loss.item())
    sim.reset_counters()
    torch.distributions.MultivariateNormal(
        mean, covariance_matrix=raw @ raw.mT + torch.eye(10, device=dev)
    ).log_prob(points).sum().backward()
    assert sim.counters()["ops"]["fallback"] == {}
    assert torch.allclose(
        torch.tensor(losses[dev.type]), torch.tensor(losses["cpu"]), rtol=1e-5, atol=1e-5
    )
    assert losses["cpu"][-1] < losses["cpu"][0]


def test_a_matrix_wider_than_the_device_factors_goes_through_the_cpu(dev: torch.device) -> None:
    a = _positive_definite(cholesky.WIDEST + 1, cholesky.WIDEST + 1)
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once a process: test_opfix_householder.py's
        got = torch.linalg.cholesky(a.to(dev))
    assert close(got, torch.linalg.cholesky(a))
    assert sim.counters()["ops"]["fallback"] == {"aten::linalg_cholesky_ex.L": 1}


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (5, 5), (2, 3, 7, 7), (64, 64)])
def test_cholesky_inverse_and_its_gradients_equal_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], upper: bool
) -> None:
    # A MultivariateNormal's precision_matrix is cholesky_inverse of its scale_tril.
    torch.manual_seed(shape[-1])
    factor = torch.linalg.cholesky(_positive_definite(*shape, dtype=torch.float64), upper=upper)
    factor.requires_grad_()
    on_device = factor.detach().to(dev).requires_grad_()
    sim.reset_counters()
    results = []
    for x in (factor, on_device):
        inverse = torch.cholesky_inverse(x, upper=upper)
        inverse.sin().sum().backward()
        results.append(inverse.detach())
    expected, got = results
    assert close(got, expected) and got.stride() == expected.stride()
    assert torch.equal(got.cpu(), got.cpu().mT)  # exactly symmetric, as potri's
    assert on_device.grad is not None and factor.grad is not None
    assert close(on_device.grad, factor.grad)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {} and counters["fixed"]["aten::cholesky_inverse"] >= 1


def test_a_multivariate_normal_s_precision_matrix_stays_on_the_device(dev: torch.device) -> None:
    covariance = _positive_definite(6, 6)
    expected = torch.distributions.MultivariateNormal(torch.zeros(6), covariance).precision_matrix
    sim.reset_counters()
    normal = torch.distributions.MultivariateNormal(torch.zeros(6, device=dev), covariance.to(dev))
    assert close(normal.precision_matrix, expected)
    assert sim.counters()["ops"]["fallback"] == {}


@pytest.mark.parametrize("unitriangular", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize(
    "shapes", [((6, 6), (6, 2)), ((3, 1, 5, 5), (2, 5, 4)), ((40, 40), (40, 1))]
)
def test_the_deprecated_triangular_solve_equals_the_cpu_s(
    dev: torch.device,
    shapes: tuple[tuple[int, ...], tuple[int, ...]],
    upper: bool,
    transpose: bool,
    unitriangular: bool,
) -> None:
    # torch.triangular_solve (GPyTorch, Pyro, older geometry code): the solution and the
    # coefficient's broadcast copy, in the CPU's layout, and their gradients.
    torch.manual_seed(shapes[0][-1])
    a_shape, b_shape = shapes
    a = torch.linalg.cholesky(_positive_definite(*a_shape, dtype=torch.float64))
    a = (a.mT if upper else a).detach().requires_grad_()
    b = torch.randn(*b_shape, dtype=torch.float64, requires_grad=True)
    on_device = [t.detach().to(dev).requires_grad_() for t in (b, a)]
    options = {"upper": upper, "transpose": transpose, "unitriangular": unitriangular}
    sim.reset_counters()
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation warning
        for rhs, coefficient in ((b, a), on_device):
            solution, copied = torch.triangular_solve(rhs, coefficient, **options)
            solution.sin().sum().backward()
            results.append((solution.detach(), copied.detach()))
    for got, expected in zip(*reversed(results)):
        assert close(got, expected) and got.stride() == expected.stride()
    for got_grad, expected_grad in zip(on_device, (b, a)):
        assert got_grad.grad is not None and expected_grad.grad is not None
        assert close(got_grad.grad, expected_grad.grad)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {} and counters["fixed"]["aten::triangular_solve.X"] >= 1
