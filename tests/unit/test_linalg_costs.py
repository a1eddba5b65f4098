"""What the cost model picks for the linalg fixes on every shipped adapter profile: a single
32x32 ``eigh`` or ``svd`` goes through DirectML's fallback (thousands of launches against a
read-back); of a batch of 1024 3x3 systems, only the triangular solve is cheaper composed.
Every linalg fix states its cost for each operator it composes, or why it has no choice."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import pytest
import torch

from dmlpatch.costs import choice, profiles
from dmlpatch.costs.choice import Chooser, Costs
from dmlpatch.opfix import registry
from dmlpatch.opfix.linalg import exponential, jacobi, lu

PROFILES = sorted(profiles.SHIPPED)


def _matrices(*shape: int) -> torch.Tensor:
    """Shapes are all a cost function reads: no memory, no device."""
    return torch.empty(*shape, device="meta")


def _composed(costs: Costs, profile: str) -> bool:
    """The Chooser's own comparison."""
    chosen = profiles.SHIPPED[profile]
    return choice.device_seconds(costs.device, chosen) <= choice.fallback_seconds(
        costs.fallback, chosen
    )


@pytest.mark.parametrize("profile", PROFILES)
def test_a_32x32_eigh_or_svd_is_cheaper_through_the_fallback(profile: str) -> None:
    a = _matrices(32, 32)
    assert not _composed(jacobi.eigh_cost(a), profile)
    assert not _composed(jacobi.eigh_cost(a, "L", False), profile)
    assert not _composed(jacobi.svd_cost(a), profile)
    assert not _composed(jacobi.svd_cost(a, False, False), profile)


#: A batch of 1024 3x3 systems: what the model picks, and why. The substitution is 13 launches
#: against the fallback's two read-backs; everything that factors the matrix is 17 launches a
#: column or more (solve, inv, det: 50 to 100) against one or two read-backs and LAPACK's
#: 0.1 MFLOP; matrix_exp's 42 launches and its read-back of the norm cost more than the
#: fallback's one read-back.
BATCHED_3X3: dict[str, tuple[Callable[..., Costs], tuple[Any, ...], dict[str, Any], bool]] = {
    "solve": (lu.solve_cost, (_matrices(1024, 3, 3), _matrices(1024, 3, 1)), {}, False),
    "inv": (lu.inv_cost, (_matrices(1024, 3, 3),), {}, False),
    "det": (lu.det_cost, (_matrices(1024, 3, 3),), {}, False),
    "solve_triangular": (
        lu.solve_triangular_cost,
        (_matrices(1024, 3, 3), _matrices(1024, 3, 1)),
        {"upper": False},
        True,
    ),
    "matrix_exp": (exponential.matrix_exp_cost, (_matrices(1024, 3, 3),), {}, False),
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", sorted(BATCHED_3X3))
def test_a_batch_of_1024_3x3_goes_the_cheaper_way(profile: str, name: str) -> None:
    cost, arguments, options, composed = BATCHED_3X3[name]
    assert _composed(cost(*arguments, **options), profile) == composed


def test_a_small_triangular_solve_is_composed_and_a_large_one_is_not() -> None:
    # Five launches a row against two read-backs: a handful of rows is the break-even.
    for profile in PROFILES:
        for n, composed in ((2, True), (16, False), (64, False)):
            costs = lu.solve_triangular_cost(_matrices(n, n), _matrices(n, 1), upper=False)
            assert _composed(costs, profile) == composed, (profile, n)


def test_every_linalg_fix_states_its_costs_or_why_it_has_none() -> None:
    linalg = [fix for fix in registry.fixes() if fix.name.startswith("linalg.")]
    assert len(linalg) == 9
    for fix in linalg:
        module = importlib.import_module(fix.module)
        operators = {kernel.op for kernel in fix.kernels}
        if fix.no_choice:
            assert not fix.costs, fix.name
            continue
        assert set(fix.costs) == operators, fix.name
        choosers = {v.operator for v in vars(module).values() if isinstance(v, Chooser)}
        assert choosers == operators, fix.name
        assert fix.reset is not None, fix.name


@pytest.mark.parametrize("name", ["linalg.lu", "linalg.jacobi", "linalg.cholesky"])
def test_a_fix_s_reset_forgets_its_choices(name: str) -> None:
    fix = registry.load(name)
    module = importlib.import_module(fix.module)
    choosers = [v for v in vars(module).values() if isinstance(v, Chooser)]
    priced: list[str] = []

    def costs() -> Costs:
        priced.append("once more")
        return Costs(choice.OnDevice(1), choice.ThroughTheCpu(0, 0))

    for chooser in choosers:
        chooser.on_device("a key", costs)
        chooser.on_device("a key", costs)  # remembered
    assert len(priced) == len(choosers) and fix.reset is not None
    fix.reset()
    for chooser in choosers:
        chooser.on_device("a key", costs)  # forgotten: priced again
    assert len(priced) == 2 * len(choosers)
    fix.reset()
