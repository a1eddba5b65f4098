"""Fixtures for the simulated-device tests.

The backend loads once per process with the default profile (``torch-directml-0.2.5``) and
the default build cache, so only the first run of the suite compiles. Behaviour that needs a
different profile or environment, or a fresh process, runs through ``helpers.run_python``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import dmlpatch.sim as sim


@pytest.fixture(scope="session")
def dev() -> Any:
    """``privateuseone:0`` of the simulated device (default profile), loaded once."""
    for key in [k for k in os.environ if k.startswith("DMLPATCH_SIM_")]:
        del os.environ[key]
    sim.load("torch-directml-0.2.5")
    return sim.device(0)
