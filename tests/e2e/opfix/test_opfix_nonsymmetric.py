"""``torch.linalg.eig`` and ``eigvals`` of general matrices: torch-directml's own CPU fallback
fails (their results are complex, which DirectML cannot hold); with dmlpatch they run on the
CPU, their complex results come back to the device equal to the CPU's, and each call is
counted and said as a fallback."""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.e2e.opfix.helpers import close, without_fixes

import dmlpatch.sim as sim


def test_without_dmlpatch_eigvals_fails(dev: torch.device) -> None:
    with without_fixes(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="Invalid or unsupported data type ComplexFloat"):
            torch.linalg.eigvals(torch.randn(3, 3, device=dev))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eig_and_eigvals_give_the_cpu_s_results_through_the_cpu(
    dev: torch.device, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    a = torch.randn(2, 5, 5, dtype=dtype)
    sim.reset_counters()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once a process, by whichever test comes first
        values = torch.linalg.eigvals(a.to(dev))
        got_values, got_vectors = torch.linalg.eig(a.to(dev))
    expected_values, expected_vectors = torch.linalg.eig(a)
    assert values.device == dev and got_vectors.device == dev
    for got, expected in ((values, expected_values), (got_values, expected_values)):
        assert close(torch.view_as_real(got.cpu()), torch.view_as_real(expected))
    assert close(torch.view_as_real(got_vectors.cpu()), torch.view_as_real(expected_vectors))
    assert sim.counters()["ops"]["fallback"] == {"aten::_linalg_eigvals": 1, "aten::linalg_eig": 1}
