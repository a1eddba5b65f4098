"""Sphinx configuration of dmlpatch's documentation site (Markdown pages through MyST).

Built by the test suite with warnings as errors (``tests/e2e/test_docs.py``):
``.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import re
from pathlib import Path

_VERSION = (Path(__file__).parent.parent / "src" / "dmlpatch" / "_version.py").read_text()

project = "dmlpatch"
author = "the dmlpatch developers"
copyright = "the dmlpatch developers"
_FOUND = re.search(r'__version__ = "([^"]+)"', _VERSION)
release = _FOUND.group(1) if _FOUND else "unknown"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
# Links to a section of a page (`page.md#a-heading`) as GitHub renders them.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
html_theme = "furo"
html_title = f"dmlpatch {release}"
html_static_path: list[str] = []
# The site works offline: no fonts, scripts or search index from elsewhere.
html_theme_options = {"navigation_with_keys": True}
