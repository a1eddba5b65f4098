"""The documentation site (docs/) builds with Sphinx with warnings as errors: a broken link, a
missing page or a page in no table of contents fails here. The commands page shows what each
command's ``--help`` prints today, and the README's "Known to work" table is the site's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    sphinx = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    built = subprocess.run(
        [*sphinx, "-d", str(tmp_path / "doctrees"), str(REPO / "docs"), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    pages = {
        p.relative_to(tmp_path / "html").as_posix() for p in (tmp_path / "html").rglob("*.html")
    }
    sources = {
        p.relative_to(REPO / "docs").with_suffix(".html").as_posix()
        for p in (REPO / "docs").rglob("*.md")
        if "_build" not in p.parts
    }
    assert sources <= pages
    known = (tmp_path / "html" / "guide" / "known-to-work.html").read_text(encoding="utf-8")
    assert "PyTorch Lightning, Fabric" in known and "pytorch-lightning 2.6.6" in known


def test_the_commands_page_shows_what_the_commands_print() -> None:
    checked = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "commands_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
