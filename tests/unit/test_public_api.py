"""The public API (``dmlpatch.__doc__``) and the module paths already written into users'
environments: renaming any of them breaks programs and activated environments on upgrade."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import dmlpatch
from dmlpatch import errors
from dmlpatch.pinning import pin
from dmlpatch.startup import activation


def test_the_package_exports_exactly_its_functions() -> None:
    assert sorted(dmlpatch.__all__) == ["__version__", "describe", "device", "patch", "unpatch"]
    for name in ("describe", "device", "patch", "unpatch"):
        assert inspect.isfunction(getattr(dmlpatch, name))


def test_errors_users_may_catch() -> None:
    for name in ("DeviceUnavailable", "SpecError", "UsageError"):
        assert issubclass(getattr(errors, name), errors.DmlpatchError)


def test_the_simulated_device_api() -> None:
    # Not loaded: the names alone (loading builds the backend).
    sim = importlib.import_module("dmlpatch.sim")
    for name in ("load", "device", "device_count", "device_name", "counters", "reset_counters"):
        assert callable(getattr(sim, name))


def test_pth_lines_name_modules_that_exist() -> None:
    """What ``dmlpatch activate`` and ``dmlpatch pin`` write into site-packages imports these."""
    for target in (activation.TARGET, pin._PTH_TARGET):
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_importing_dmlpatch_imports_no_internal_package() -> None:
    code = (
        "import sys, dmlpatch; print(sorted(m for m in sys.modules if m.startswith('dmlpatch.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['dmlpatch._version']"
