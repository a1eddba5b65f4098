"""The start-up import budget: what an activated process, a child of the runner and ``import
dmlpatch.auto`` pay before the program's first line. Bootstrapping must import neither torch
(work waits until the program imports it) nor the standard library's heavier modules that a
plain interpreter does not load (``typing``, ``re``, ``threading``): every Python process of an
activated environment pays for them, torch or not."""

from __future__ import annotations

import json

import pytest
from tests.support import clean_env, run_python

#: Modules a plain ``python -c pass`` does not import, and bootstrapping must not.
BUDGET = ("typing", "re", "threading", "torch", "torch_directml")

PROGRAM = f"""
import sys
plain = [name for name in {BUDGET!r} if name in sys.modules]
from dmlpatch.startup import bootstrap
bootstrap.startup(main=False)
after = [name for name in {BUDGET!r} if name in sys.modules]
print(repr({{"plain": plain, "after": after}}).replace("'", '"'))
"""


@pytest.mark.parametrize("device", ["auto", "cpu", "sim", "directml"])
def test_bootstrapping_imports_nothing_a_plain_interpreter_does_not(device: str) -> None:
    for _ in range(2):  # the first start of a new version may fill dmlpatch's caches
        result = run_python(["-c", PROGRAM], env=clean_env(DMLPATCH_DEVICE=device))
        assert result.code == 0, result.err
    seen = json.loads(result.out)
    assert seen["plain"] == []
    assert seen["after"] == []
