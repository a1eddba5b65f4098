"""Helpers for tests: run Python (plain or under dmlpatch) in a subprocess, capture it all."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
#: dmlpatch's first-run notice (dmlpatch.rewriting.preparation).
FIRST_RUN = re.compile(
    r"^dmlpatch: (first run after installing or upgrading|preparing) .* for DirectML"
)


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        """stderr's lines but blank ones and the first-run notice (said when preparing
        modules takes a second: whether it does depends on what earlier tests cached)."""
        return [
            line for line in self.err.splitlines() if line.strip() and not FIRST_RUN.search(line)
        ]

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


def linked_venv() -> Iterator[tuple[str, Path]]:
    """A throw-away venv whose only link to our packages is one .pth written at creation.

    It lives outside pytest's private (0700) temporary root so that an unprivileged user can
    run its interpreter too. Yields (python, purelib); removed afterwards.
    """
    root = Path(tempfile.mkdtemp(prefix="dmlpatch-venv-"))
    root.chmod(0o755)
    try:
        venv.EnvBuilder(with_pip=False).create(root)
        python = str(root / "bin" / "python")
        purelib = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
        (Path(purelib) / "_test_link.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
        )
        yield python, Path(purelib)
    finally:
        shutil.rmtree(root)


# -- what is on disk -----------------------------------------------------------------------


Stamps = dict[str, tuple[int, int]]


def distribution_digests(*names: str) -> dict[str, str]:
    """sha256 of every file the named installed distributions list (their RECORD)."""
    import hashlib
    import importlib.metadata

    digests = {}
    for name in names:
        distribution = importlib.metadata.distribution(name)
        for file in distribution.files or ():
            path = Path(distribution.locate_file(file))
            if path.suffix != ".pyc" and path.is_file():
                digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def file_stamps(*roots: Path) -> Stamps:
    """Every file under ``roots``, with (size, mtime_ns): enough to see what a run wrote."""
    stamps = {}
    for root in roots:
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                try:
                    info = os.stat(path)
                except OSError:
                    continue
                stamps[path] = (info.st_size, info.st_mtime_ns)
    return stamps


def written_between(before: Stamps, after: Stamps) -> list[str]:
    """Files created or changed (removed ones too, as changes), sorted."""
    changed = {path for path, stamp in after.items() if before.get(path) != stamp}
    changed |= set(before) - set(after)
    return sorted(changed)
