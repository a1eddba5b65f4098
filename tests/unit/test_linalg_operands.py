"""The linalg fixes decide what the device takes by one set of tests
(``dmlpatch.opfix.linalg.operands``): no fix spells the float dtypes, the square test or a size
range again, and the tests answer as the fixes read them."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from dmlpatch.opfix.linalg import operands

LINALG = Path(operands.__file__).parent

#: What each fix used to write for itself.
SPELLED_AGAIN = {
    "the float dtypes": re.compile(r"torch\.float32, torch\.float64"),
    "the square test": re.compile(r"(\w+)\.shape\[-[12]\] == \1\.shape\[-[12]\]"),
    "a size range": re.compile(r"\b0 < [^<\n]+ <="),
}


def test_no_linalg_fix_spells_the_operand_tests_again() -> None:
    fixes = [path for path in LINALG.glob("*.py") if path != Path(operands.__file__)]
    assert len(fixes) >= 8
    for path in fixes:
        source = path.read_text(encoding="utf-8")
        for what, pattern in SPELLED_AGAIN.items():
            assert not pattern.search(source), f"{path.name} spells {what}"


def test_the_operand_tests() -> None:
    assert set(operands.FLOATS) == {torch.float32, torch.float64}
    assert operands.square_floats(torch.zeros(3, 3), 3)
    assert operands.square_floats(torch.zeros(0, 3, 3, dtype=torch.float64), 3)  # empty batch
    assert not operands.square_floats(torch.zeros(3, 3), 2)
    assert not operands.square_floats(torch.zeros(0, 0), 3)
    assert not operands.square_floats(torch.zeros(2, 3), 3)
    assert not operands.square_floats(torch.zeros(3), 3)
    assert not operands.square_floats(torch.zeros(3, 3, dtype=torch.float16), 3)
    assert operands.float_matrices(torch.zeros(2, 5, dtype=torch.float64))
    assert not operands.float_matrices(torch.zeros(0, 3))
    assert not operands.float_matrices(torch.zeros(4))
    assert not operands.float_matrices(torch.zeros(3, 3, dtype=torch.int64))
    assert operands.within(1, 1) and not operands.within(0, 1) and not operands.within(2, 1)
