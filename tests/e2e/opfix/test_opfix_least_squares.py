"""``torch.linalg.lstsq`` on the device for systems of full rank (QR, then a triangular solve):
torch-directml has no kernel for it, so without dmlpatch each call copies through the CPU,
where LAPACK's gelsy solves it. With it the solution equals gelsy's, with its rank and its
empty residuals and singular values, in every shape, batch and dtype, tall or wide, and so do
the gradients; a system whose full rank cannot be proved goes through the CPU, where gelsy
decides its rank."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import as_accurate, close, without_fixes

import dmlpatch.sim as sim

# What these tests check is the composition: the cost model would send most of these calls
# through the fallback.
pytestmark = pytest.mark.usefixtures("composed")


def test_without_dmlpatch_lstsq_falls_back(dev: torch.device) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        torch.linalg.lstsq(torch.randn(6, 3, device=dev), torch.randn(6, 2, device=dev))
        fallbacks = sim.counters()["ops"]["fallback"]
    assert "aten::linalg_lstsq.out" in fallbacks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((6, 3), (6, 2)),
        ((2, 6, 3), (2, 6, 2)),
        ((2, 6, 3), (2, 6)),  # a batch of vectors
        ((6, 3), (6,)),
        ((3, 6), (3, 2)),  # wide: the minimum-norm solution
        ((5, 5), (5, 1)),
        ((100, 64), (100, 3)),
    ],
)
def test_lstsq_equals_gelsy_s(
    dev: torch.device, a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    torch.manual_seed(sum(a_shape))
    a, b = torch.randn(*a_shape, dtype=dtype), torch.randn(*b_shape, dtype=dtype)
    a = a + 2 * torch.eye(*a_shape[-2:], dtype=dtype)  # well conditioned, square ones too
    expected = torch.linalg.lstsq(a, b)
    exact = torch.linalg.lstsq(a.double(), b.double()).solution
    sim.reset_counters()
    got = torch.linalg.lstsq(a.to(dev), b.to(dev))
    counters = sim.counters()["ops"]
    assert counters["fixed"] == {"aten::linalg_lstsq.out": 1} and counters["fallback"] == {}
    assert as_accurate(got.solution, expected.solution, exact)
    for name in ("residuals", "rank", "singular_values"):
        got_part, expected_part = getattr(got, name).cpu(), getattr(expected, name)
        assert got_part.dtype == expected_part.dtype and torch.equal(got_part, expected_part)


def test_gradients_equal_the_cpu_s(dev: torch.device) -> None:
    torch.manual_seed(1)
    a = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 7, 2, dtype=torch.float64, requires_grad=True)
    on_device = [t.detach().to(dev).requires_grad_() for t in (a, b)]
    sim.reset_counters()
    for x, y in ((a, b), on_device):
        torch.linalg.lstsq(x, y).solution.sin().sum().backward()
    for got, expected in zip(on_device, (a, b)):
        assert got.grad is not None and expected.grad is not None
        assert close(got.grad, expected.grad)
    assert sim.counters()["ops"]["fallback"] == {}


@pytest.mark.parametrize("rcond", [None, 1e-2])
def test_a_system_not_surely_of_full_rank_is_gelsy_s_to_decide(
    dev: torch.device, rcond: object
) -> None:
    torch.manual_seed(2)
    a = torch.randn(6, 3)
    if rcond is None:
        a[:, 2] = a[:, 1]  # rank 2
    else:
        a[:, 2] = a[:, 1] + 1e-3 * a[:, 0]  # full rank, but not at this rcond
    b = torch.randn(6, 2)
    expected = torch.linalg.lstsq(a, b, rcond=rcond)
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.linalg.lstsq(a.to(dev), b.to(dev), rcond=rcond)
    assert close(got.solution, expected.solution)
    assert torch.equal(got.rank.cpu(), expected.rank) and int(expected.rank) == 2
    assert sim.counters()["ops"]["fallback"] == {"aten::linalg_lstsq.out": 1}


def test_a_shape_torch_refuses_gets_torch_s_error(dev: torch.device) -> None:
    a, b = torch.randn(6, 3), torch.randn(2, 2, 6, 2)
    with pytest.raises(RuntimeError) as on_cpu:
        torch.linalg.lstsq(a, b)
    with warnings.catch_warnings(), pytest.raises(RuntimeError) as on_device:
        warnings.simplefilter("ignore")
        torch.linalg.lstsq(a.to(dev), b.to(dev))
    assert str(on_device.value) == str(on_cpu.value)


@pytest.mark.parametrize("driver", ["gels", "gelsd", "gelss"])
@pytest.mark.parametrize(
    "a_shape, b_shape", [((6, 3), (6, 2)), ((2, 6, 3), (2, 6)), ((3, 6), (3, 2)), ((4, 4), (4, 1))]
)
def test_the_other_drivers_return_what_they_return_on_the_cpu(
    dev: torch.device, a_shape: tuple[int, ...], b_shape: tuple[int, ...], driver: str
) -> None:
    # gels (CUDA's driver): an empty rank, the residuals of a tall system; gelsd and gelss:
    # the rank, the singular values, the residuals where every matrix is of full rank.
    torch.manual_seed(len(a_shape) + b_shape[-1])
    a = torch.randn(*a_shape, dtype=torch.float64) + 2 * torch.eye(*a_shape[-2:])
    b = torch.randn(*b_shape, dtype=torch.float64)
    expected = torch.linalg.lstsq(a, b, driver=driver)
    sim.reset_counters()
    got = torch.linalg.lstsq(a.to(dev), b.to(dev), driver=driver)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {} and counters["fixed"]["aten::linalg_lstsq.out"] == 1
    for name in ("solution", "residuals", "rank", "singular_values"):
        assert close(getattr(got, name), getattr(expected, name)), name


@pytest.mark.parametrize("driver", ["gels", "gelsd"])
def test_a_rank_deficient_system_under_another_driver_is_the_cpu_s(
    dev: torch.device, driver: str
) -> None:
    torch.manual_seed(3)
    a = torch.randn(6, 3, dtype=torch.float64)
    a[:, 2] = a[:, 1]
    b = torch.randn(6, 2, dtype=torch.float64)
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected = torch.linalg.lstsq(a, b, driver=driver)
        except RuntimeError as refused:  # gels on torch 2.14: "does not have full rank"
            with pytest.raises(type(refused), match="does not have full rank"):
                torch.linalg.lstsq(a.to(dev), b.to(dev), driver=driver)
        else:
            got = torch.linalg.lstsq(a.to(dev), b.to(dev), driver=driver)
            for name in ("solution", "residuals", "rank", "singular_values"):
                assert close(getattr(got, name), getattr(expected, name)), name
            assert sim.counters()["ops"]["fallback"] == {"aten::linalg_lstsq.out": 1}
