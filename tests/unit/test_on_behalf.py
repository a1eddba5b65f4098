"""Calls the runtime makes on the program's behalf: a warning about the caller names the
program's line, not dmlpatch's (``dmlpatch.runtime.on_behalf``)."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest

from dmlpatch.runtime import on_behalf


def _torch_like(value: int, *, scale: int = 1) -> int:
    warnings.warn("about the caller", FutureWarning, stacklevel=2)
    return value * scale


def _runtime(*args: Any, **kwargs: Any) -> Any:
    """What a runtime function does: call the original for the program."""
    return on_behalf.call(_torch_like, args, kwargs)


def test_the_warning_names_the_program_s_line_and_the_result_is_the_call_s() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        result = _runtime(3, scale=2)
    assert result == 6
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


def test_once_per_location_is_the_program_s_registry() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            _runtime(1)
    assert len(caught) == 1
    assert "__warningregistry__" in globals()


def test_an_exception_passes_through_unchanged() -> None:
    def fails() -> None:
        raise ValueError("the original's error")

    with pytest.raises(ValueError, match="the original's error"):
        on_behalf.call(fails, (), {}, depth=1)
