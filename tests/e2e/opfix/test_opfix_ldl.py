"""``torch.linalg.ldl_factor`` and ``ldl_solve`` on the device (Bunch-Kaufman pivoting, as
LAPACK's ``sytf2``/``sytrs``): torch-directml has no kernel for them, so without dmlpatch each
call copies through the CPU. With it the factors, the pivots (1x1 and 2x2 blocks, with and
without interchanges), ``info`` and the solutions equal the CPU's, batches included; what the
device does not factor goes through the CPU, counted and said as a fallback."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import close, without_fixes

import dmlpatch.sim as sim
from dmlpatch.opfix.linalg import ldl

# What these tests check is the composition: the cost model would send most of these calls
# through the fallback.
pytestmark = pytest.mark.usefixtures("composed")

FLOATS = [torch.float32, torch.float64]


def _indefinite(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    a = torch.randn(*shape, dtype=dtype)
    return a + a.mT


def _the_cpu_s_and_the_device_s(
    a: torch.Tensor, dev: torch.device, **options: bool
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], dict[str, dict[str, int]]]:
    expected = tuple(torch.linalg.ldl_factor_ex(a, **options))
    sim.reset_counters()
    got = tuple(torch.linalg.ldl_factor_ex(a.to(dev), **options))
    return expected, got, sim.counters()["ops"]


def test_without_dmlpatch_they_fall_back(dev: torch.device) -> None:
    a = _indefinite(5, 5).to(dev)
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        factors, pivots = torch.linalg.ldl_factor(a)
        torch.linalg.ldl_solve(factors, pivots, torch.randn(5, 2, device=dev))
        fallbacks = set(sim.counters()["ops"]["fallback"])
    assert {"aten::linalg_ldl_factor_ex.out", "aten::linalg_ldl_solve.out"} <= fallbacks


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (7, 7), (4, 9, 9), (40, 40), (64, 64)])
def test_factors_pivots_and_info_equal_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    torch.manual_seed(shape[-1])
    a = _indefinite(*shape, dtype=dtype)
    # LAPACK reads the lower triangle: the upper is noise it must not see.
    noisy = a + torch.randn_like(a).triu(1)
    (factors, pivots, info), (got_factors, got_pivots, got_info), ops = _the_cpu_s_and_the_device_s(
        noisy, dev
    )
    assert torch.equal(got_pivots.cpu(), pivots) and torch.equal(got_info.cpu(), info)
    assert close(got_factors, factors) and got_factors.stride() == factors.stride()
    assert ops["fallback"] == {} and ops["fixed"] == {"aten::linalg_ldl_factor_ex.out": 1}


def test_every_kind_of_pivot_is_the_cpu_s(dev: torch.device) -> None:
    # Zero diagonals force 2x2 blocks; a small diagonal beside a large column forces an
    # interchange; a zero column is singular (info) and is left as it is.
    blocks = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0, 0, 0, 2], [0, 0, 2, 0]])
    swap = torch.tensor([[0.01, 1.0, 0.2], [1.0, 5.0, 0.3], [0.2, 0.3, 1.0]])
    far_block = torch.tensor([[0.0, 0.1, 3.0], [0.1, 0.0, 0.2], [3.0, 0.2, 0.0]])
    singular = torch.tensor([[0.0, 0.0, 0.0], [0.0, 2.0, 1.0], [0.0, 1.0, 3.0]])
    seen = set()
    for a in (blocks, swap, far_block, singular):
        (factors, pivots, info), (got_factors, got_pivots, got_info), ops = (
            _the_cpu_s_and_the_device_s(a, dev)
        )
        assert torch.equal(got_pivots.cpu(), pivots) and torch.equal(got_info.cpu(), info)
        assert close(got_factors, factors)
        assert ops["fallback"] == {}
        order = torch.arange(1, a.shape[-1] + 1, dtype=torch.int32)
        seen |= {"2x2" for p in pivots.tolist() if p < 0}
        seen |= {"interchange" for p, k in zip(pivots.abs().tolist(), order.tolist()) if p != k}
        seen |= {"singular" for i in [int(info)] if i > 0}
    assert seen == {"2x2", "interchange", "singular"}


def test_a_batch_whose_matrices_choose_differently_equals_the_cpu_s(dev: torch.device) -> None:
    # Each matrix of a batch takes its own blocks: they step through the columns together.
    torch.manual_seed(7)
    a = _indefinite(16, 12, 12, dtype=torch.float64)
    a[::3].diagonal(dim1=-2, dim2=-1).zero_()
    (factors, pivots, info), (got_factors, got_pivots, got_info), _ = _the_cpu_s_and_the_device_s(
        a, dev
    )
    assert len({tuple(p) for p in (pivots < 0).tolist()}) > 4  # the batch is not uniform
    assert torch.equal(got_pivots.cpu(), pivots) and torch.equal(got_info.cpu(), info)
    assert close(got_factors, factors)


def test_hermitian_factors_of_a_real_matrix_are_the_cpu_s(dev: torch.device) -> None:
    a = _indefinite(6, 6, dtype=torch.float64)
    expected, got, _ = _the_cpu_s_and_the_device_s(a, dev, hermitian=True)
    assert all(close(g, e) for g, e in zip(got, expected))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((5, 5), (5, 3)), ((3, 8, 8), (8, 1)), ((6, 6), (3, 6, 2)), ((3, 6, 6), (1, 6, 2))],
)
def test_solutions_equal_the_cpu_s(
    dev: torch.device, a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    torch.manual_seed(a_shape[-1])
    a = _indefinite(*a_shape, dtype=dtype)
    a[..., 0, 0] = 0  # a 2x2 block or an interchange first
    b = torch.randn(*b_shape, dtype=dtype)
    factors, pivots = torch.linalg.ldl_factor(a)
    expected = torch.linalg.ldl_solve(factors, pivots, b)
    sim.reset_counters()
    got_factors, got_pivots = torch.linalg.ldl_factor(a.to(dev))
    got = torch.linalg.ldl_solve(got_factors, got_pivots, b.to(dev))
    ops = sim.counters()["ops"]
    assert close(got, expected) and got.stride() == expected.stride()
    assert torch.allclose((a @ got.cpu()), b.expand_as(expected), atol=1e-3)
    assert ops["fallback"] == {} and ops["fixed"]["aten::linalg_ldl_solve.out"] == 1


def test_factors_broadcast_against_a_batch_are_solved_where_the_cpu_s_kernel_crashes(
    dev: torch.device,
) -> None:
    # torch's CPU ldl_solve (2.4.1 to 2.14.1) ends the process with a segmentation fault
    # when a batch of one factorisation meets a larger batch of right-hand sides, and so
    # would DirectML's fallback; the device's solve broadcasts as documented.
    a = _indefinite(1, 6, 6, dtype=torch.float64)
    b = torch.randn(3, 6, 2, dtype=torch.float64)
    factors, pivots = torch.linalg.ldl_factor(a.to(dev))
    got = torch.linalg.ldl_solve(factors, pivots, b.to(dev)).cpu()
    assert got.shape == (3, 6, 2)
    assert torch.allclose(a @ got, b, atol=1e-10)
    assert torch.allclose(got, torch.linalg.solve(a, b), atol=1e-10)


def test_a_matrix_holding_a_nan_goes_through_the_cpu(dev: torch.device) -> None:
    a = _indefinite(4, 4)
    a[2, 1] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DirectML's fallback warning, as it would say it
        expected, got, ops = _the_cpu_s_and_the_device_s(a, dev)
    assert all(close(g, e) for g, e in zip(got, expected))
    assert ops["fallback"] == {"aten::linalg_ldl_factor_ex.out": 1}


def test_a_matrix_wider_than_the_device_factors_goes_through_the_cpu(dev: torch.device) -> None:
    a = _indefinite(ldl.WIDEST + 1, ldl.WIDEST + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once a process
        expected, got, ops = _the_cpu_s_and_the_device_s(a, dev)
    assert all(close(g, e) for g, e in zip(got, expected))
    assert ops["fallback"] == {"aten::linalg_ldl_factor_ex.out": 1}


def test_errors_are_the_cpu_s(dev: torch.device) -> None:
    for call in (
        lambda d: torch.linalg.ldl_factor(torch.randn(3, 4, device=d)),
        lambda d: torch.linalg.ldl_factor(torch.zeros(2, 2, device=d)),
        lambda d: torch.linalg.ldl_solve(
            torch.eye(3, device=d),
            torch.ones(3, dtype=torch.int32, device=d),
            torch.ones(4, 1, device=d),
        ),
    ):
        with pytest.raises(RuntimeError) as on_cpu:
            call(torch.device("cpu"))
        with pytest.raises(RuntimeError) as on_device, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call(dev)
        assert str(on_device.value) == str(on_cpu.value)
