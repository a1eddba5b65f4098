"""``import dmlpatch.auto`` at the top of a script activates dmlpatch for that process.

The device comes from ``$DMLPATCH_DEVICE`` (default ``auto``). Libraries imported after this
line are patched; the script itself is not rewritten (it is already running) — use
``python -m dmlpatch script.py`` for that.
"""

from dmlpatch import engine

engine.activate()
