"""``torch.linalg.eigh``/``eigvalsh``/``svd``/``svdvals`` on the device (Jacobi rotations):
torch-directml has no kernel for them, so without dmlpatch each call copies through the CPU.
With it the eigenvalues and singular values equal the CPU's, and the vectors equal the CPU's
up to each one's sign (which PyTorch leaves to the device), in every shape, batch, dtype and
mode; gradients equal the CPU's; rank-deficient and repeated spectra give orthonormal vectors
that rebuild the matrix; a NaN gets the CPU's error; a matrix wider than the device decomposes
goes through the CPU, counted and said as a fallback."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import as_accurate, close, no_copies, without_fixes

import dmlpatch.sim as sim
from dmlpatch.opfix.linalg import jacobi

# What these tests check is the composition: the cost model would send most of these calls
# through the fallback.
pytestmark = pytest.mark.usefixtures("composed")

FLOATS = [torch.float32, torch.float64]


def _orthogonal(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(*shape, dtype=dtype))[0]


def _symmetric(batch: tuple[int, ...], n: int, dtype: torch.dtype) -> torch.Tensor:
    """A symmetric matrix whose eigenvalues are at least 0.5 apart, so that its eigenvectors
    are well defined to the dtype's rounding."""
    q = _orthogonal(*batch, n, n, dtype=dtype)
    values = torch.linspace(-0.25 * n, 0.25 * n, n, dtype=dtype)[torch.randperm(n)]
    return (q * values) @ q.mT


def _with_singular_values(
    batch: tuple[int, ...], m: int, n: int, dtype: torch.dtype
) -> torch.Tensor:
    k = min(m, n)
    u = _orthogonal(*batch, m, k, dtype=dtype)
    v = _orthogonal(*batch, n, k, dtype=dtype)
    return (u * torch.linspace(1.0, 1.0 + 0.5 * k, k, dtype=dtype)) @ v.mT


def _signs_like(got: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """+1/-1 per column of ``got``: the sign that turns it into ``reference``'s column."""
    signs = torch.sign((got.cpu() * reference).sum(-2, keepdim=True))
    return torch.where(signs == 0, torch.ones_like(signs), signs)


def _only_the_fix_ran(counters: dict, name: str) -> bool:
    own_move = counters["transfers"]["h2d"]["count"] == 1
    return (
        (no_copies(counters) or own_move)
        and counters["ops"]["fixed"].get(name) == 1
        and counters["ops"]["fallback"] == {}
    )


def test_without_dmlpatch_eigh_and_svd_fall_back(dev: torch.device) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.reset_counters()
        a = torch.randn(4, 4, device=dev)
        torch.linalg.eigh(a)
        torch.linalg.svd(a)
        fallbacks = sim.counters()["ops"]["fallback"]
    assert {"aten::_linalg_eigh.eigenvalues", "aten::_linalg_svd.U"} <= set(fallbacks)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("uplo", ["L", "U"])
@pytest.mark.parametrize(
    "batch, n", [((), 1), ((), 2), ((), 3), ((), 5), ((2, 3), 4), ((), 17), ((), 64)]
)
def test_eigh_equals_the_cpu_s(
    dev: torch.device, batch: tuple[int, ...], n: int, uplo: str, dtype: torch.dtype
) -> None:
    torch.manual_seed(n)
    a = _symmetric(batch, n, dtype)
    # LAPACK reads one triangle: the other is noise it must not see.
    noisy = a + torch.randn_like(a).triu(1) if uplo == "L" else a + torch.randn_like(a).tril(-1)
    values, vectors = torch.linalg.eigh(noisy, UPLO=uplo)
    exact_values, exact_vectors = torch.linalg.eigh(noisy.double(), UPLO=uplo)
    exact_vectors = exact_vectors * _signs_like(exact_vectors, vectors.double())
    sim.reset_counters()
    got_values, got_vectors = torch.linalg.eigh(noisy.to(dev), UPLO=uplo)
    assert _only_the_fix_ran(sim.counters(), "aten::_linalg_eigh.eigenvalues")
    assert as_accurate(got_values, values, exact_values)
    got_vectors = got_vectors.cpu() * _signs_like(got_vectors, vectors)
    assert as_accurate(got_vectors, vectors, exact_vectors)
    assert as_accurate(torch.linalg.eigvalsh(noisy.to(dev), UPLO=uplo), values, exact_values)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("full_matrices", [False, True])
@pytest.mark.parametrize(
    "shape", [(5, 3), (3, 5), (4, 4), (1, 1), (7, 1), (1, 6), (2, 3, 6, 4), (100, 8), (33, 33)]
)
def test_svd_equals_the_cpu_s(
    dev: torch.device, shape: tuple[int, ...], full_matrices: bool, dtype: torch.dtype
) -> None:
    torch.manual_seed(sum(shape))
    a = _with_singular_values(shape[:-2], shape[-2], shape[-1], dtype)
    u, s, vh = torch.linalg.svd(a, full_matrices=full_matrices)
    exact_u, exact_s, exact_vh = torch.linalg.svd(a.double(), full_matrices=False)
    k = s.shape[-1]
    exact_signs = _signs_like(exact_u, u[..., :k].double())
    exact_u, exact_vh = exact_u * exact_signs, exact_vh * exact_signs.mT
    sim.reset_counters()
    got_u, got_s, got_vh = torch.linalg.svd(a.to(dev), full_matrices=full_matrices)
    assert _only_the_fix_ran(sim.counters(), "aten::_linalg_svd.U")
    assert as_accurate(got_s, s, exact_s)
    signs = _signs_like(got_u[..., :k], u[..., :k])
    assert as_accurate(got_u.cpu()[..., :k] * signs, u[..., :k], exact_u)
    assert as_accurate(got_vh.cpu()[..., :k, :] * signs.mT, vh[..., :k, :], exact_vh)
    assert got_u.shape == u.shape and got_vh.shape == vh.shape
    for basis in (got_u.cpu(), got_vh.cpu().mT):  # the completion too is orthonormal
        identity = torch.eye(basis.shape[-1], dtype=dtype).expand((*basis.mT.shape[:-1], -1))
        assert close(basis.mT @ basis, identity)
    assert as_accurate(torch.linalg.svdvals(a.to(dev)), s, exact_s)


@pytest.mark.parametrize("dtype", FLOATS)
def test_random_matrices_give_the_cpu_s_values(dev: torch.device, dtype: torch.dtype) -> None:
    torch.manual_seed(7)
    a = torch.randn(4, 32, 32, dtype=dtype)
    symmetric = a + a.mT
    assert close(torch.linalg.eigvalsh(symmetric.to(dev)), torch.linalg.eigvalsh(symmetric))
    assert close(torch.linalg.svdvals(a.to(dev)), torch.linalg.svdvals(a))


@pytest.mark.parametrize(
    "a",
    [
        torch.eye(5),
        torch.zeros(4, 4),
        torch.diag(torch.tensor([2.0, 2.0, -1.0, 2.0])),
        torch.ones(6, 6),
    ],
    ids=["identity", "zeros", "repeated", "rank-one"],
)
def test_repeated_eigenvalues_give_orthonormal_vectors(dev: torch.device, a: torch.Tensor) -> None:
    values, vectors = torch.linalg.eigh(a.to(dev))
    values, vectors = values.cpu(), vectors.cpu()
    assert close(values, torch.linalg.eigvalsh(a))
    assert close(vectors.mT @ vectors, torch.eye(a.shape[-1]))
    assert close((vectors * values) @ vectors.mT, a)


@pytest.mark.parametrize(
    "a",
    [torch.zeros(4, 3), torch.ones(5, 4), torch.ones(3, 6), torch.zeros(2, 2)],
    ids=["zeros", "rank-one-tall", "rank-one-wide", "zero-square"],
)
@pytest.mark.parametrize("full_matrices", [False, True])
def test_rank_deficient_matrices_give_orthonormal_vectors(
    dev: torch.device, a: torch.Tensor, full_matrices: bool
) -> None:
    u, s, vh = (t.cpu() for t in torch.linalg.svd(a.to(dev), full_matrices=full_matrices))
    assert close(s, torch.linalg.svdvals(a))
    assert close(u.mT @ u, torch.eye(u.shape[-1]))
    assert close(vh @ vh.mT, torch.eye(vh.shape[-2]))
    k = s.shape[-1]
    assert close((u[:, :k] * s) @ vh[:k], a)


def test_eigh_gradients_equal_the_cpu_s(dev: torch.device) -> None:
    torch.manual_seed(3)
    a = _symmetric((2,), 6, torch.float64).requires_grad_()
    on_device = a.detach().to(dev).requires_grad_()
    weights = torch.randn(6, 6, dtype=torch.float64)
    for x, w in ((a, weights), (on_device, weights.to(dev))):
        values, vectors = torch.linalg.eigh(x)
        (values.sin().sum() + (vectors.square() * w).sum()).backward()
    assert on_device.grad is not None and a.grad is not None
    assert close(on_device.grad, a.grad)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (3, 5, 5)])
def test_svd_gradients_equal_the_cpu_s(dev: torch.device, shape: tuple[int, ...]) -> None:
    torch.manual_seed(4)
    a = _with_singular_values(shape[:-2], shape[-2], shape[-1], torch.float64).requires_grad_()
    on_device = a.detach().to(dev).requires_grad_()
    for x in (a, on_device):
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        (
            s.square().sum()
            + (u.square() * u.square().flip(-1)).sum()
            + vh.square()[..., 0, :].sum()
        ).backward()
    assert on_device.grad is not None and a.grad is not None
    assert close(on_device.grad, a.grad)


def test_what_is_built_on_svd_equals_the_cpu_s(dev: torch.device) -> None:
    torch.manual_seed(5)
    a = torch.randn(3, 7, 5)
    a[0, :, 4] = a[0, :, 0]  # rank 4
    for build in (
        torch.linalg.pinv,
        torch.linalg.matrix_rank,
        lambda x: torch.linalg.matrix_norm(x, ord=2),
        lambda x: torch.linalg.cond(x[1:]),  # a singular matrix's is a ratio of roundings
        lambda x: torch.linalg.matrix_norm(x, ord="nuc"),
    ):
        assert close(build(a.to(dev)), build(a))


def test_a_matrix_wider_than_the_device_decomposes_goes_through_the_cpu(
    dev: torch.device,
) -> None:
    n = jacobi.WIDEST + 1
    a = torch.randn(n, n)
    symmetric = a + a.mT
    sim.reset_counters()
    with warnings.catch_warnings():
        # Said once a process, by whichever test makes the first (test_opfix_householder.py
        # checks the words and test_warning_lines.py the line).
        warnings.simplefilter("ignore")
        got_values = torch.linalg.eigvalsh(symmetric.to(dev))
        got_s = torch.linalg.svdvals(a.to(dev))
    assert close(got_values, torch.linalg.eigvalsh(symmetric))
    assert close(got_s, torch.linalg.svdvals(a))
    counters = sim.counters()["ops"]
    assert counters["fixed"] == {}
    assert set(counters["fallback"]) == {"aten::_linalg_eigh.eigenvalues", "aten::_linalg_svd.U"}


@pytest.mark.parametrize(
    "decomposition",
    [torch.linalg.eigh, torch.linalg.eigvalsh, torch.linalg.svd, torch.linalg.svdvals],
)
def test_a_nan_gets_the_cpu_s_error(dev: torch.device, decomposition) -> None:
    a = torch.randn(4, 4)
    a = a + a.mT
    a[1, 2] = a[2, 1] = float("nan")
    with pytest.raises(RuntimeError) as on_cpu:
        decomposition(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError) as on_device:
            decomposition(a.to(dev))
    assert type(on_device.value) is type(on_cpu.value)
    assert str(on_device.value) == str(on_cpu.value)
