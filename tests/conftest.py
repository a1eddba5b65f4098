"""Shared fixtures (helpers that tests import live in support.py)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

#: Suites that use the simulated device inside the pytest process (others start programs).
IN_PROCESS_DEVICE = ("tests/e2e/sim/", "tests/e2e/opfix/")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Load the simulated device before any test runs when an in-process suite is collected.

    PyTorch's autograd engine sizes its per-device queues once, at the process's first backward
    pass; a device registered after that fails every later backward on it with
    ``device_ready_queues_``'s INTERNAL ASSERT. Unit tests run programs with a backward pass on
    the CPU in this process (the idiom corpus), so the device must exist before them, whatever
    the order.
    """
    if not any(any(part in item.nodeid for part in IN_PROCESS_DEVICE) for item in session.items):
        return
    import os

    import dmlpatch.sim as sim

    for key in [k for k in os.environ if k.startswith("DMLPATCH_SIM_")]:
        del os.environ[key]
    sim.load("torch-directml-0.2.5")


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a dedented file under tmp_path and return its path."""

    def writer(relative: str, content: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")
        return path

    return writer


@pytest.fixture
def fake_distribution(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Make an installed-looking distribution (dist-info + package) in a site directory."""
    site = tmp_path / "site"
    site.mkdir()

    def make(name: str, version: str, files: dict[str, str]) -> Path:
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
        )
        for relative, content in files.items():
            path = site / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")
        return site

    yield make


REAL_PACKAGE = "torch-directml==0.2.5.dev240914"


@pytest.fixture(scope="session")
def real_torch_directml(tmp_path_factory) -> Path:
    """The real torch-directml wheel (no dependencies) in a directory of its own.

    Its native library needs torch 2.4.1 and Windows/WSL2's D3D12: on this machine it fails
    the ways users on plain Linux or with a replaced torch see it fail.
    """
    import subprocess
    import sys

    target = tmp_path_factory.mktemp("torch_directml")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(target),
            REAL_PACKAGE,
        ],
        check=True,
    )
    return target


# -- figures in the terminal summary ------------------------------------------------------------


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what tests recorded with ``record_property("terminal_summary", text)``.

    For figures a test reports (the rewrite corpus counts): they show in ``pytest -q`` output,
    where a passing test's prints do not.
    """
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == "terminal_summary":
                    terminalreporter.write_line(str(value))
