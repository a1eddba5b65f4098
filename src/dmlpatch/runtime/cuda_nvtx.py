"""``torch.cuda.nvtx`` on DirectML: profiler ranges and marks that do nothing."""

from __future__ import annotations

from typing import Any

from dmlpatch.runtime.cuda_target import target as _target


class _Nvtx:
    """``torch.cuda.nvtx``: profiler ranges and marks, nothing on DirectML (torch builds without
    CUDA, such as torch-directml's, raise ``NVTX functions not installed`` instead)."""

    def __init__(self) -> None:
        self._depth = 0

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda.nvtx, name)

    def _own(self, name: str) -> Any:
        if _target() is None:
            import torch

            return getattr(torch.cuda.nvtx, name)
        return None

    def range_push(self, msg: str) -> int:
        own = self._own("range_push")
        if own is not None:
            return int(own(msg))
        self._depth += 1
        return self._depth - 1

    def range_pop(self) -> int:
        own = self._own("range_pop")
        if own is not None:
            return int(own())
        self._depth = max(self._depth - 1, 0)
        return self._depth

    def range_start(self, msg: str) -> int:
        own = self._own("range_start")
        return int(own(msg)) if own is not None else 0

    def range_end(self, range_id: int) -> None:
        own = self._own("range_end")
        if own is not None:
            own(range_id)

    def mark(self, msg: str) -> None:
        own = self._own("mark")
        if own is not None:
            own(msg)

    def range(self, msg: str, *args: Any, **kwargs: Any) -> Any:
        """A context manager (and decorator, as contextlib makes it) doing nothing."""
        own = self._own("range")
        if own is not None:
            return own(msg, *args, **kwargs)
        import contextlib

        return contextlib.nullcontext()


nvtx = _Nvtx()
