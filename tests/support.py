"""Helpers for tests: run Python (plain or under dmlpatch) in a subprocess, capture it all."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    def program_err(self) -> str:
        """stderr without dmlpatch's own lines (to compare with a plain run)."""
        return "\n".join(x for x in self.err.splitlines() if not x.startswith("dmlpatch:"))


def clean_env(**extra: str) -> dict[str, str]:
    # DMLPATCH_CACHE_DIR is where the simulated device is built: keep it, drop the rest.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DMLPATCH_") or k == "DMLPATCH_CACHE_DIR"
    }
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def run_python(
    args: list[str],
    *,
    env: Optional[dict[str, str]] = None,
    cwd: Optional[Path] = None,
    stdin: Optional[str] = None,
    timeout: float = 300,
    python: str = sys.executable,
) -> Result:
    completed = subprocess.run(
        [python, *args],
        env=env if env is not None else clean_env(),
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(completed.returncode, completed.stdout, completed.stderr)
