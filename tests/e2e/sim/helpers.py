"""Subprocess helpers for the simulated-device tests (fresh processes: other profiles and
environments, once-per-process warnings, build races, bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
#: src/ for dmlpatch, the repository root for tests.e2e.sim.models.
REPO_PATH = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


def sim_env(**overrides: str | None) -> dict[str, str]:
    """The current environment without DMLPATCH_SIM_* / DMLPATCH_TRACE, plus overrides."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DMLPATCH_SIM_") and k != "DMLPATCH_TRACE"
    }
    env["PYTHONPATH"] = REPO_PATH + os.pathsep + env.get("PYTHONPATH", "")
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_python(
    code: str, timeout: float = 240, **env: str | None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with :func:`sim_env` (``env`` as overrides)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=sim_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_json(code: str, **env: str | None) -> Any:
    """Run ``code``, which must print one JSON document as its last stdout line."""
    proc = run_python(code, **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
