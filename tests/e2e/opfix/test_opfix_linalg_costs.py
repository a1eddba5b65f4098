"""The linalg fixes choose per call between their composition and DirectML's CPU fallback by
the cost model: each fix's stated cost agrees with what the simulated device counts when it
runs the composition (kernel launches and read-backs within 15%, bytes within a factor of two)
and when it runs the fallback (read-backs and bytes copied); the choice is made per call and
remembered per shape; both ways give the CPU's results; ``DMLPATCH_DEVICE_OPS`` keeps the
composition for the operators it names and no other; uninstalling the fixes forgets the
choices."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple

import pytest
import torch
from tests.e2e.opfix.helpers import close, decide_again, grads

import dmlpatch.sim as sim
from dmlpatch import environment_variables, opfix
from dmlpatch.costs import simulated
from dmlpatch.costs.choice import Costs
from dmlpatch.opfix.linalg import (
    cholesky,
    exponential,
    householder,
    jacobi,
    ldl,
    least_squares,
    lu,
)
from dmlpatch.opfix.on_the_cpu import through_the_cpu
from dmlpatch.placement import fallbacks

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _said_again() -> Iterator[None]:
    """DirectML's fallback warning is said once per operator and process: the many fallbacks
    here must not keep the tests after these from seeing their own."""
    said = set(fallbacks._warned)
    yield
    fallbacks._warned.intersection_update(said)


class Case(NamedTuple):
    """One call of a fixed operator: the kernel's arguments (made on the CPU), and its cost
    function."""

    operator: Any
    cost: Callable[..., Costs]
    arguments: Callable[[], tuple[Any, ...]]
    options: dict[str, Any] = {}
    #: The composition loops until the data say it has converged (Jacobi's sweeps).
    iterative: bool = False


def _general(*shape: int) -> torch.Tensor:
    n = shape[-1]
    return torch.randn(*shape, dtype=torch.float64).float() + n * torch.eye(n)


def _definite(*shape: int) -> torch.Tensor:
    a = torch.randn(*shape)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def _symmetric(*shape: int) -> torch.Tensor:
    a = torch.randn(*shape)
    return a + a.mT


def _factor(*shape: int) -> torch.Tensor:
    return torch.linalg.cholesky(_definite(*shape))


def _lu(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.lu_factor(_general(*shape))


def _ldl(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.ldl_factor(_symmetric(*shape))


def _geqrf(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.geqrf(torch.randn(*shape))


def _square(n: int, batch: int) -> dict[str, Case]:
    b = (batch,) if batch > 1 else ()
    return {
        f"cholesky {b} {n}": Case(
            aten.linalg_cholesky_ex, cholesky.factor_cost, lambda: (_definite(*b, n, n),)
        ),
        f"cholesky_solve {b} {n}": Case(
            aten._cholesky_solve_helper,
            cholesky.solve_cost,
            lambda: (torch.randn(*b, n, 2), _factor(*b, n, n), False),
        ),
        f"cholesky_inverse {b} {n}": Case(
            aten.cholesky_inverse, cholesky.inverse_cost, lambda: (_factor(*b, n, n),)
        ),
        f"lu_factor {b} {n}": Case(
            aten.linalg_lu_factor_ex, lu.lu_factor_cost, lambda: (_general(*b, n, n),)
        ),
        f"det {b} {n}": Case(aten._linalg_det, lu.det_cost, lambda: (_general(*b, n, n),)),
        f"slogdet {b} {n}": Case(
            aten._linalg_slogdet, lu.slogdet_cost, lambda: (_general(*b, n, n),)
        ),
        f"lu_unpack {b} {n}": Case(aten.lu_unpack, lu.lu_unpack_cost, lambda: _lu(*b, n, n)),
        f"solve_triangular {b} {n}": Case(
            aten.linalg_solve_triangular,
            lu.solve_triangular_cost,
            lambda: (_factor(*b, n, n), torch.randn(*b, n, 2)),
            {"upper": False},
        ),
        f"solve_triangular from the right {b} {n}": Case(
            aten.linalg_solve_triangular,
            lu.solve_triangular_cost,
            lambda: (_factor(*b, n, n), torch.randn(*b, 2, n)),
            {"upper": False, "left": False},
        ),
        f"triangular_solve {b} {n}": Case(
            aten.triangular_solve,
            lu.triangular_solve_cost,
            lambda: (torch.randn(*b, n, 2), _factor(*b, n, n), False),
        ),
        f"inv {b} {n}": Case(aten.linalg_inv_ex, lu.inv_cost, lambda: (_general(*b, n, n),)),
        f"solve {b} {n}": Case(
            aten._linalg_solve_ex,
            lu.solve_cost,
            lambda: (_general(*b, n, n), torch.randn(*b, n, 2)),
        ),
        f"lu_solve {b} {n}": Case(
            aten.linalg_lu_solve,
            lu.lu_solve_cost,
            lambda: (*_lu(*b, n, n), torch.randn(*b, n, 2)),
        ),
        f"lu {b} {n}": Case(aten.linalg_lu, lu.lu_cost, lambda: (torch.randn(*b, n, n),)),
        f"qr {b} {n}": Case(aten.linalg_qr, householder.qr_cost, lambda: (torch.randn(*b, n, n),)),
        f"householder_product {b} {n}": Case(
            aten.linalg_householder_product,
            householder.householder_product_cost,
            lambda: _geqrf(*b, n, n),
        ),
        f"geqrf {b} {n}": Case(
            aten.geqrf, householder.geqrf_cost, lambda: (torch.randn(*b, n, n),)
        ),
        f"ormqr {b} {n}": Case(
            aten.ormqr,
            householder.ormqr_cost,
            lambda: (*_geqrf(*b, n, n), torch.randn(*b, n, 2)),
        ),
        f"eigh {b} {n}": Case(
            aten._linalg_eigh,
            jacobi.eigh_cost,
            lambda: (_symmetric(*b, n, n),),
            iterative=True,
        ),
        f"eigvalsh {b} {n}": Case(
            aten._linalg_eigh,
            jacobi.eigh_cost,
            lambda: (_symmetric(*b, n, n), "L", False),
            iterative=True,
        ),
        f"svd {b} {n}": Case(
            aten._linalg_svd,
            jacobi.svd_cost,
            lambda: (torch.randn(*b, n, n),),
            iterative=True,
        ),
        f"svdvals {b} {n}": Case(
            aten._linalg_svd,
            jacobi.svd_cost,
            lambda: (torch.randn(*b, n, n), False, False),
            iterative=True,
        ),
        f"lstsq {b} {n}": Case(
            aten.linalg_lstsq,
            least_squares.lstsq_cost,
            lambda: (_general(*b, n, n), torch.randn(*b, n, 2)),
        ),
        f"ldl_factor {b} {n}": Case(
            aten.linalg_ldl_factor_ex, ldl.factor_cost, lambda: (_symmetric(*b, n, n),)
        ),
        f"ldl_solve {b} {n}": Case(
            aten.linalg_ldl_solve,
            ldl.solve_cost,
            lambda: (*_ldl(*b, n, n), torch.randn(*b, n, 2)),
        ),
        f"matrix_exp {b} {n}": Case(
            aten.linalg_matrix_exp,
            exponential.matrix_exp_cost,
            lambda: (torch.randn(*b, n, n),),
        ),
    }


def _rectangular(m: int, n: int) -> dict[str, Case]:
    return {
        f"lu_factor {m}x{n}": Case(
            aten.linalg_lu_factor_ex, lu.lu_factor_cost, lambda: (torch.randn(m, n),)
        ),
        f"lu {m}x{n}": Case(aten.linalg_lu, lu.lu_cost, lambda: (torch.randn(m, n),)),
        f"qr complete {m}x{n}": Case(
            aten.linalg_qr,
            householder.qr_cost,
            lambda: (torch.randn(m, n), "complete"),
        ),
        f"qr r {m}x{n}": Case(
            aten.linalg_qr, householder.qr_cost, lambda: (torch.randn(m, n), "r")
        ),
        f"svd full {m}x{n}": Case(
            aten._linalg_svd,
            jacobi.svd_cost,
            lambda: (torch.randn(m, n), True),
            iterative=True,
        ),
        f"lstsq gels {m}x{n}": Case(
            aten.linalg_lstsq,
            least_squares.lstsq_cost,
            lambda: (torch.randn(m, n), torch.randn(m, 2)),
            {"driver": "gels"},
        ),
        f"lstsq gelsd {m}x{n}": Case(
            aten.linalg_lstsq,
            least_squares.lstsq_cost,
            lambda: (torch.randn(m, n), torch.randn(m, 2)),
            {"driver": "gelsd"},
            iterative=True,
        ),
    }


CASES = {
    **_square(3, 64),
    **_square(8, 1),
    **_square(16, 8),
    **_rectangular(12, 4),
    **_rectangular(4, 12),
}


def _on(dev: torch.device, arguments: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(x.to(dev) if isinstance(x, torch.Tensor) else x for x in arguments)


def _priced(function: Callable[[], Any]) -> Any:
    """What the simulated device counted for a second call (the first builds Jacobi's
    pairings, once per size)."""
    function()
    sim.reset_counters()
    function()
    return simulated.priced()


@pytest.mark.usefixtures("composed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_composition_costs_what_its_fix_says(dev: torch.device, name: str) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    arguments = _on(dev, case.arguments())
    stated = case.cost(*arguments, **case.options).device
    counted = _priced(lambda: case.operator(*arguments, **case.options))
    if case.iterative:
        # The sweeps are the data's: a size takes one of two counts (3 or 4 of 3x3 matrices),
        # the typical count half a sweep from either; a convergence check per sweep.
        assert counted.launches == pytest.approx(stated.launches, rel=0.2), counted.launches
        assert abs(stated.readbacks - counted.readbacks) <= 1, counted.readbacks
    else:
        assert counted.launches == pytest.approx(stated.launches, rel=0.15), counted.launches
        assert round(stated.readbacks) == counted.readbacks
    spent = sum(entry["bytes"] for entry in _costs().values())
    assert spent / 2 <= stated.bytes <= spent * 2, (stated.bytes, spent)


def _costs() -> dict[str, Any]:
    from dmlpatch.sim import counting

    return counting.costs()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_fallback_costs_what_its_fix_says(dev: torch.device, name: str) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    arguments = _on(dev, case.arguments())
    stated = case.cost(*arguments, **case.options).fallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        # What a kernel does when the model picks the fallback.
        operator = case.operator._qualified_op_name
        counted = _priced(
            lambda: through_the_cpu(operator, case.operator, arguments, **case.options)
        )
    assert counted.readbacks == stated.arguments
    assert counted.copied_bytes == stated.down_bytes + stated.up_bytes


def _ran(counters: dict[str, Any], name: str) -> str:
    ops = counters["ops"]
    if ops["fixed"].get(name) and not ops["fallback"].get(name):
        return "composition"
    if ops["fallback"].get(name) and not ops["fixed"].get(name):
        return "fallback"
    return f"neither or both: {ops['fixed']} {ops['fallback']}"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The choices decided afresh, and again after the test (which may set
    ``DMLPATCH_DEVICE_OPS`` through the monkeypatch given)."""
    monkeypatch.delenv(environment_variables.DMLPATCH_DEVICE_OPS, raising=False)
    decide_again()
    yield monkeypatch
    decide_again()


def test_a_32x32_eigh_or_svd_takes_the_fallback(dev: torch.device, fresh: Any) -> None:
    torch.manual_seed(0)
    a = torch.randn(32, 32)
    a = a + a.mT
    for function, name in (
        (torch.linalg.eigvalsh, "aten::_linalg_eigh.eigenvalues"),
        (torch.linalg.svdvals, "aten::_linalg_svd.U"),
    ):
        sim.reset_counters()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DirectML's, said once per operator and process
            got = function(a.to(dev))
        assert _ran(sim.counters(), name) == "fallback"
        assert close(got, function(a))


#: What the cost model picks, on the simulated device's adapter (rdna2-desktop, the default),
#: for a batch of 1024 3x3 systems (``tests/unit/test_linalg_costs.py`` has every shipped
#: adapter's): a triangular solve is 13 launches against the fallback's two read-backs; an LU
#: factorisation is 17 launches a column, more than a read-back and LAPACK's few microseconds.
BATCHED_3X3: dict[
    str, tuple[Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]], str, str]
] = {
    "solve": (
        torch.linalg.solve,
        lambda: (_general(1024, 3, 3), torch.randn(1024, 3, 1)),
        "aten::_linalg_solve_ex.result",
        "fallback",
    ),
    "inv": (
        torch.linalg.inv,
        lambda: (_general(1024, 3, 3),),
        "aten::linalg_inv_ex.inverse",
        "fallback",
    ),
    "det": (
        torch.linalg.det,
        lambda: (_general(1024, 3, 3),),
        "aten::_linalg_det.result",
        "fallback",
    ),
    "solve_triangular": (
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False),
        lambda: (_factor(1024, 3, 3), torch.randn(1024, 3, 1)),
        "aten::linalg_solve_triangular.out",
        "composition",
    ),
    "matrix_exp": (
        torch.linalg.matrix_exp,
        lambda: (torch.randn(1024, 3, 3),),
        "aten::linalg_matrix_exp",
        "fallback",
    ),
}


@pytest.mark.parametrize("name", sorted(BATCHED_3X3))
def test_a_batch_of_1024_3x3_takes_the_cheaper_way(
    dev: torch.device, fresh: Any, name: str
) -> None:
    function, inputs, operator, expected = BATCHED_3X3[name]
    torch.manual_seed(0)
    arguments = inputs()
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = function(*_on(dev, arguments))
    assert _ran(sim.counters(), operator) == expected
    assert close(got, function(*arguments))


#: Calls the cost model sends through the fallback on the default adapter, each forward (and
#: backward where the fix's own tests check one); with DMLPATCH_DEVICE_OPS=all they are
#: composed, and either way the results are the CPU's.
BOTH_WAYS: dict[str, tuple[Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]], str]] = {
    "cholesky backward": (
        grads(torch.linalg.cholesky),
        lambda: (_definite(4, 8, 8).double(),),
        "aten::linalg_cholesky_ex.L",
    ),
    "cholesky_solve": (
        torch.cholesky_solve,
        lambda: (torch.randn(4, 8, 2), _factor(4, 8, 8)),
        "aten::_cholesky_solve_helper",
    ),
    "cholesky_inverse": (
        torch.cholesky_inverse,
        lambda: (_factor(8, 8),),
        "aten::cholesky_inverse",
    ),
    "det backward": (
        grads(torch.linalg.det),
        lambda: (_general(2, 8, 8).double(),),
        "aten::_linalg_det.result",
    ),
    "slogdet": (torch.linalg.slogdet, lambda: (_general(2, 8, 8),), "aten::_linalg_slogdet.sign"),
    "inv": (torch.linalg.inv, lambda: (_general(2, 8, 8),), "aten::linalg_inv_ex.inverse"),
    "solve backward": (
        grads(torch.linalg.solve, wrt=1),
        lambda: (_general(2, 8, 8).double(), torch.randn(2, 8, 3, dtype=torch.float64)),
        "aten::_linalg_solve_ex.result",
    ),
    "lu_factor": (
        torch.linalg.lu_factor,
        lambda: (_general(8, 8),),
        "aten::linalg_lu_factor_ex.out",
    ),
    "lu_unpack": (
        lambda lu_, p: torch.lu_unpack(lu_, p),
        lambda: _lu(12, 12),
        "aten::lu_unpack.out",
    ),
    "lu_solve": (
        torch.linalg.lu_solve,
        lambda: (*_lu(8, 8), torch.randn(8, 2)),
        "aten::linalg_lu_solve.out",
    ),
    "lu": (torch.linalg.lu, lambda: (torch.randn(6, 6),), "aten::linalg_lu.out"),
    "solve_triangular backward": (
        grads(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False), wrt=2),
        lambda: (_factor(16, 16).double(), torch.randn(16, 2, dtype=torch.float64)),
        "aten::linalg_solve_triangular.out",
    ),
    "triangular_solve": (
        lambda b, a: torch.triangular_solve(b, a, upper=False),
        lambda: (torch.randn(16, 2), _factor(16, 16)),
        "aten::triangular_solve.X",
    ),
    "qr backward": (
        grads(lambda a: torch.cat([f.flatten() for f in torch.linalg.qr(a)])),
        lambda: (torch.randn(6, 4, dtype=torch.float64),),
        "aten::linalg_qr.out",
    ),
    "householder_product": (
        torch.linalg.householder_product,
        lambda: _geqrf(12, 12),
        "aten::linalg_householder_product",
    ),
    "geqrf": (torch.geqrf, lambda: (torch.randn(6, 6),), "aten::geqrf"),
    "ormqr": (
        torch.ormqr,
        lambda: (*_geqrf(16, 16), torch.randn(16, 2)),
        "aten::ormqr",
    ),
    "eigvalsh backward": (
        grads(torch.linalg.eigvalsh),
        lambda: (_symmetric(6, 6).double(),),
        "aten::_linalg_eigh.eigenvalues",
    ),
    "svdvals backward": (
        grads(torch.linalg.svdvals),
        lambda: (torch.randn(6, 4, dtype=torch.float64),),
        "aten::_linalg_svd.U",
    ),
    "lstsq": (
        lambda a, b: torch.linalg.lstsq(a, b).solution,
        lambda: (_general(8, 8), torch.randn(8, 2)),
        "aten::linalg_lstsq.out",
    ),
    "ldl_factor": (
        torch.linalg.ldl_factor,
        lambda: (_symmetric(6, 6),),
        "aten::linalg_ldl_factor_ex.out",
    ),
    "ldl_solve": (
        torch.linalg.ldl_solve,
        lambda: (*_ldl(6, 6), torch.randn(6, 2)),
        "aten::linalg_ldl_solve.out",
    ),
    "matrix_exp backward": (
        grads(torch.linalg.matrix_exp),
        lambda: (torch.randn(4, 4, dtype=torch.float64),),
        "aten::linalg_matrix_exp",
    ),
}


@pytest.mark.parametrize("forced", [False, True], ids=["as the model picks", "composed"])
@pytest.mark.parametrize("name", sorted(BOTH_WAYS))
def test_both_ways_give_the_cpu_s_results(
    dev: torch.device, fresh: pytest.MonkeyPatch, name: str, forced: bool
) -> None:
    function, inputs, operator = BOTH_WAYS[name]
    if forced:
        fresh.setenv(environment_variables.DMLPATCH_DEVICE_OPS, "all")
    torch.manual_seed(0)
    arguments = inputs()
    expected = function(*arguments)
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = function(*_on(dev, arguments))
    assert _ran(sim.counters(), operator) == ("composition" if forced else "fallback")
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for device_result, cpu_result in zip(got, expected):
        assert close(device_result, cpu_result), name


def test_device_ops_keeps_the_composition_of_the_operators_named_only(
    dev: torch.device, fresh: pytest.MonkeyPatch
) -> None:
    fresh.setenv(environment_variables.DMLPATCH_DEVICE_OPS, "aten::_linalg_eigh")
    torch.manual_seed(0)
    a = _symmetric(32, 32)
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = torch.linalg.eigvalsh(a.to(dev))
        singular = torch.linalg.svdvals(a.to(dev))
    counters = sim.counters()
    assert _ran(counters, "aten::_linalg_eigh.eigenvalues") == "composition"
    assert _ran(counters, "aten::_linalg_svd.U") == "fallback"
    assert close(values, torch.linalg.eigvalsh(a)) and close(singular, torch.linalg.svdvals(a))


def test_a_choice_is_remembered_until_the_fixes_are_uninstalled(
    dev: torch.device, fresh: pytest.MonkeyPatch
) -> None:
    a = _definite(8, 8).to(dev)

    def ran() -> str:
        sim.reset_counters()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.linalg.cholesky_ex(a)
        return _ran(sim.counters(), "aten::linalg_cholesky_ex.L")

    assert ran() == "fallback"
    fresh.setenv(environment_variables.DMLPATCH_DEVICE_OPS, "all")
    assert ran() == "fallback"  # the answer for this shape, remembered
    opfix.uninstall()
    opfix.install("sim", "torch-directml-0.2.5")
    assert ran() == "composition"  # decided again, DMLPATCH_DEVICE_OPS read again
