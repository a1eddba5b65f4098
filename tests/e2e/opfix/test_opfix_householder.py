"""``torch.linalg.qr`` on the device (Householder reflections, as LAPACK's): torch-directml has no
QR kernel, so without dmlpatch each call copies through the CPU. With it Q and R equal the
CPU's in every mode, shape, batch and dtype, zero columns included, and so do the gradients;
a matrix wider than the device factors goes through the CPU, counted and said as a fallback."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import close, no_copies, without_fixes

import dmlpatch.sim as sim
from dmlpatch.opfix.linalg import householder

# What these tests check is the composition: the cost model would send most of these calls
# through the fallback.
pytestmark = pytest.mark.usefixtures("composed")

SHAPES = [(5, 3), (3, 5), (4, 4), (1, 1), (7, 1), (1, 6), (2, 3, 6, 4), (64, 64)]


def test_without_dmlpatch_qr_falls_back(dev: torch.device) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        torch.linalg.qr(torch.randn(4, 3, device=dev))
        fallbacks = sim.counters()["ops"]["fallback"]
    assert "aten::linalg_qr.out" in fallbacks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", SHAPES)
def test_q_and_r_equal_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], mode: str, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    a = torch.randn(*shape, dtype=dtype)
    q, r = torch.linalg.qr(a, mode=mode)
    sim.reset_counters()
    got_q, got_r = torch.linalg.qr(a.to(dev), mode=mode)
    counters = sim.counters()
    assert close(got_r, r)
    assert close(got_q, q) if mode != "r" else got_q.numel() == 0
    assert no_copies(counters) or counters["transfers"]["h2d"]["count"] == 1  # a's own move
    assert counters["ops"]["fixed"].get("aten::linalg_qr.out") == 1
    assert counters["ops"]["fallback"] == {}


def test_columns_already_zero_get_no_reflection(dev: torch.device) -> None:
    # A column zero below its diagonal gets no reflection (tau = 0) and keeps its sign, as in
    # LAPACK: an upper triangular matrix is its own R with Q the identity; a zero first column
    # stays zero with Q's first column e1.
    upper = torch.randn(5, 4).triu()
    upper[1, 1] = -abs(upper[1, 1])
    zero_first = torch.randn(5, 4)
    zero_first[:, 0] = 0
    for a in (upper, zero_first):
        q, r = torch.linalg.qr(a, mode="complete")
        got_q, got_r = torch.linalg.qr(a.to(dev), mode="complete")
        assert close(got_q, q) and close(got_r, r)
    got_q, got_r = torch.linalg.qr(upper.to(dev))
    assert torch.equal(got_r.cpu(), upper[:4]) and torch.equal(got_q.cpu(), torch.eye(5, 4))


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (3, 5, 5)])
def test_gradients_equal_the_cpu_s(dev: torch.device, shape: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    a = torch.randn(*shape, requires_grad=True)
    on_device = a.detach().to(dev).requires_grad_()
    for x in (a, on_device):
        q, r = torch.linalg.qr(x)
        (q.sin().sum() + (r * r).sum()).backward()
    assert on_device.grad is not None and a.grad is not None
    assert close(on_device.grad, a.grad)


def test_a_matrix_wider_than_the_device_factors_goes_through_the_cpu(
    dev: torch.device,
) -> None:
    a = torch.randn(3, householder.WIDEST + 1)
    sim.reset_counters()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got_q, got_r = torch.linalg.qr(a.to(dev))
    q, r = torch.linalg.qr(a)
    assert close(got_q, q) and close(got_r, r)
    assert sim.counters()["ops"]["fixed"].get("aten::linalg_qr.out") is None
    assert any("'aten::linalg_qr.out' is not currently supported" in str(w.message) for w in caught)


def test_an_unknown_mode_is_torch_s_error(dev: torch.device) -> None:
    with pytest.raises(RuntimeError) as on_cpu:
        torch.linalg.qr(torch.randn(3, 3), mode="full")
    with pytest.raises(RuntimeError) as on_device:
        torch.linalg.qr(torch.randn(3, 3, device=dev), mode="full")
    assert str(on_device.value) == str(on_cpu.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape, k", [((5, 3), 3), ((5, 3), 2), ((2, 4, 4), 4), ((6, 6), 1)])
def test_householder_product_equals_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], k: int, dtype: torch.dtype
) -> None:
    # torch.linalg.householder_product (LAPACK's orgqr): the orthogonal map of
    # nn.utils.parametrizations.orthogonal for a non-square weight, forward and backward.
    torch.manual_seed(k)
    reflectors = torch.randn(*shape, dtype=dtype, requires_grad=True)
    tau = torch.rand(*shape[:-2], k, dtype=dtype, requires_grad=True)
    on_device = [t.detach().to(dev).requires_grad_() for t in (reflectors, tau)]
    weights = torch.randn(shape[-2:], dtype=dtype)
    sim.reset_counters()
    for inputs, w in (((reflectors, tau), weights), (on_device, weights.to(dev))):
        q = torch.linalg.householder_product(*inputs)
        (q * w).sum().backward()
    assert close(torch.linalg.householder_product(*on_device), q.detach().cpu())
    for got, expected in zip(on_device, (reflectors, tau)):
        assert got.grad is not None and expected.grad is not None
        assert close(got.grad, expected.grad)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {}
    assert counters["fixed"]["aten::linalg_householder_product"] >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 6, 6), (64, 64)])
def test_geqrf_equals_the_cpu_s_in_lapack_s_layout(
    dev: torch.device, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    torch.manual_seed(2)
    a = torch.randn(*shape, dtype=dtype)
    stored, tau = torch.geqrf(a)
    sim.reset_counters()
    got_stored, got_tau = torch.geqrf(a.to(dev))
    counters = sim.counters()["ops"]
    assert close(got_stored, stored) and close(got_tau, tau)
    assert got_stored.stride() == stored.stride()
    assert counters["fallback"] == {} and counters["fixed"]["aten::geqrf"] == 1


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("shape, k", [((6, 4), 4), ((6, 4), 2), ((3, 5, 5), 5)])
def test_ormqr_multiplies_by_the_cpu_s_q_and_its_gradients_are_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], k: int, left: bool, transpose: bool
) -> None:
    torch.manual_seed(k)
    stored, tau = torch.geqrf(torch.randn(*shape, dtype=torch.float64))
    stored, tau = stored[..., :k], tau[..., :k]
    m = shape[-2]
    other_shape = (*shape[:-2], m, 3) if left else (*shape[:-2], 3, m)
    other = torch.randn(other_shape, dtype=torch.float64)
    cpu_inputs = [t.clone().requires_grad_() for t in (stored, tau, other)]
    device_inputs = [t.to(dev).requires_grad_() for t in (stored, tau, other)]
    sim.reset_counters()
    results = []
    for inputs in (cpu_inputs, device_inputs):
        product = torch.ormqr(*inputs, left=left, transpose=transpose)
        product.sin().sum().backward()
        results.append(product)
    assert close(results[1], results[0].detach())
    assert results[1].stride() == results[0].stride()
    for got, expected in zip(device_inputs, cpu_inputs):
        assert got.grad is not None and expected.grad is not None
        assert close(got.grad, expected.grad)
    counters = sim.counters()["ops"]
    assert counters["fallback"] == {} and counters["fixed"]["aten::ormqr"] >= 1


def test_ormqr_of_mismatched_batches_is_the_cpu_s_error(dev: torch.device) -> None:
    stored, tau = torch.geqrf(torch.randn(2, 4, 4))
    other = torch.randn(3, 4, 2)
    with pytest.raises(RuntimeError) as on_cpu:
        torch.ormqr(stored, tau, other)
    with pytest.raises(RuntimeError) as on_device, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.ormqr(stored.to(dev), tau.to(dev), other.to(dev))
    assert str(on_device.value) == str(on_cpu.value)
