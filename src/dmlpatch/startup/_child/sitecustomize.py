"""Starts child processes of ``python -m dmlpatch`` / ``dmlpatch run`` patched.

The runner prepends this directory to ``PYTHONPATH``; subprocesses, multiprocessing spawn
workers and DDP ranks then start with the same patches and device. Any ``sitecustomize`` that
was already on the path is imported after this one, so nothing the environment relied on is lost.
"""

import os
import sys


def _chain_to_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  (the environment's own, if any)
    except ImportError as error:
        if error.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved_path
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _start_patched() -> None:
    try:
        from dmlpatch.startup import bootstrap
    except ImportError as error:
        sys.stderr.write(f"dmlpatch: warning: not patching this child process ({error})\n")
        return
    bootstrap.startup()


_start_patched()
_chain_to_next_sitecustomize()
