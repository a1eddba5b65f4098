"""The operator-fix registry: every fix declares itself (its kernels, which fixes it yields to,
its state's reset), precedence is declared rather than a list position, every catalogue entry
fixed by a kernel names a fix that exists."""

from __future__ import annotations

import importlib
from pathlib import Path

from dmlpatch.gaps import catalogue
from dmlpatch.opfix import registry


def test_every_fix_module_is_registered_and_no_other() -> None:
    root = Path(registry.__file__).parent
    modules = {
        ".".join(path.relative_to(root).with_suffix("").parts)
        for path in root.glob("*/*.py")
        if path.name != "__init__.py"
    }
    with_kernels = {
        name
        for name in modules
        if hasattr(importlib.import_module(f"dmlpatch.opfix.{name}"), "KERNELS")
    }
    assert with_kernels == set(registry.FIXES)


def test_two_fixes_of_one_operator_say_which_yields() -> None:
    fixes = registry.fixes()
    assert registry.conflicts(fixes) == []
    half = next(fix for fix in fixes if fix.name == "precision.half_on_host")
    assert half.yields_to == ("vision.sampling",)
    order = [fix.name for fix in fixes]
    assert order.index("vision.sampling") < order.index("precision.half_on_host")
    undeclared = [fix._replace(yields_to=()) if fix is half else fix for fix in fixes]
    assert registry.conflicts(undeclared) == [
        "aten::grid_sampler_2d: vision.sampling and precision.half_on_host"
    ]


def test_every_fixed_catalogue_entry_names_a_registered_fix() -> None:
    by_module = {fix.module: fix for fix in registry.fixes()}
    for failure in catalogue.FAILURES:
        if failure.fix == "kernel" and failure.fixed_in in by_module:
            assert failure.key in registry.entries(by_module[failure.fixed_in])
    resizing = by_module["dmlpatch.opfix.vision.resizing"]
    assert registry.entries(resizing) == ["antialiased-resize"]
