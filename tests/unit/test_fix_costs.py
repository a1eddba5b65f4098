"""Every operator fix states how it earns its place against DirectML's CPU fallback: ``COSTS``
(per operator it may leave to the fallback, the cost of its composition and of the fallback)
or ``NO_CHOICE`` (one sentence: why no call is cheaper through the fallback), never both and
never neither. A fix with costs keeps one chooser per operator of them at its module's top
level, where a test's ``decide_again`` finds it, and its ``reset`` forgets their answers."""

from __future__ import annotations

import importlib

import pytest

from dmlpatch.costs import choice
from dmlpatch.costs.choice import Chooser, Costs
from dmlpatch.opfix import registry

FIXES = registry.fixes()


@pytest.mark.parametrize("fix", FIXES, ids=[fix.name for fix in FIXES])
def test_a_fix_states_its_costs_or_why_it_has_none(fix: registry.Fix) -> None:
    reason = fix.no_choice.strip()
    assert bool(fix.costs) != bool(reason), "COSTS or NO_CHOICE, one of the two"
    if reason:
        assert len(reason.split()) >= 8, reason  # a sentence that says why
        return
    operators = {kernel.op for kernel in fix.kernels}
    assert set(fix.costs) <= operators, set(fix.costs) - operators
    assert all(callable(cost) for cost in fix.costs.values())
    module = importlib.import_module(fix.module)
    choosers = {v.operator for v in vars(module).values() if isinstance(v, Chooser)}
    assert choosers == set(fix.costs)
    assert fix.reset is not None


def test_every_fix_is_declared() -> None:
    assert {fix.name for fix in FIXES} == set(registry.FIXES)


@pytest.mark.parametrize(
    "fix", [fix for fix in FIXES if fix.costs], ids=[fix.name for fix in FIXES if fix.costs]
)
def test_a_fix_s_reset_forgets_its_choices(fix: registry.Fix) -> None:
    module = importlib.import_module(fix.module)
    choosers = [v for v in vars(module).values() if isinstance(v, Chooser)]
    priced: list[str] = []

    def costs() -> Costs:
        priced.append("once more")
        return Costs(choice.OnDevice(1), choice.ThroughTheCpu(0, 0))

    assert fix.reset is not None
    fix.reset()
    for chooser in choosers:
        chooser.on_device("a key", costs)
        chooser.on_device("a key", costs)  # remembered
    assert len(priced) == len(choosers)
    fix.reset()
    for chooser in choosers:
        chooser.on_device("a key", costs)  # forgotten: priced again
    assert len(priced) == 2 * len(choosers)
    fix.reset()
