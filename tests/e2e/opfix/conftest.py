"""Fixtures for the op-fix tests: the simulated device (default profile, default build cache)
with dmlpatch's fixes installed for the duration of each test module, then removed, so that
other suites in the same process see the device as DirectML ships it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from tests.e2e.opfix.helpers import PROFILE, decide_again

import dmlpatch.sim as sim
from dmlpatch import environment_variables, opfix


@pytest.fixture(scope="module")
def dev() -> Iterator[torch.device]:
    """``privateuseone:0`` of the simulated device with the 0.2.5 profile's fixes installed."""
    for key in [
        k
        for k in os.environ
        if k.startswith("DMLPATCH_SIM_") or k == environment_variables.DMLPATCH_CPU_OPS
    ]:
        del os.environ[key]
    sim.load(PROFILE)
    opfix.uninstall()
    opfix.install("sim", PROFILE)
    yield sim.device(0)
    opfix.uninstall()


@pytest.fixture
def composed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every fix composes each call it takes, whatever the cost model says the fallback would
    save (``DMLPATCH_DEVICE_OPS=all``): for tests of what the compositions compute."""
    monkeypatch.setenv(environment_variables.DMLPATCH_DEVICE_OPS, "all")
    decide_again()
    yield
    decide_again()
