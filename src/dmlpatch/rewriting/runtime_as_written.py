"""What a module dmlpatch cannot make consistent calls instead of CUDA: CUDA itself, as written.

Discovery routes a module here instead of to ``dmlpatch.rewriting.runtime`` when it has device sites
but also uses a ``torch.cuda`` function the runtime does not answer (``get_rng_state``,
``CUDAGraph``...): told that CUDA is available, its code would reach that call and fail where plain
python ran on the CPU. So every function here does exactly what the CUDA call it replaced does; only
``is_available()``, the moment such a module decides where to run, also says, once per module, that
it stays where plain python would put it. A module that never asks says nothing: importing one that
is never used (a CUDA prefetcher, a benchmark helper) is not news.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

#: Module name -> the unanswered ``torch.cuda`` names that keep it as written.
_unanswered: dict[str, tuple[str, ...]] = {}
_lock = threading.Lock()


def keep(module: str, names: tuple[str, ...]) -> None:
    """``module`` is loaded routed here because it uses ``names``."""
    with _lock:
        _unanswered[module] = names


def is_available() -> bool:
    """``torch.cuda.is_available()``, plus one line naming the module that asked."""
    caller = sys._getframe(1).f_globals.get("__name__", "?")
    names = _unanswered.get(caller)
    if names is not None:
        from dmlpatch import log

        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        log.warn_once(
            f"as-written:{caller}",
            f"{caller} chooses its device as under plain python: it uses "
            f"torch.cuda.{names[0]}{more}, which dmlpatch cannot answer off CUDA",
        )
    import torch

    return bool(torch.cuda.is_available())


def device(spec: Any = "cuda") -> Any:
    """A CUDA device literal, unchanged."""
    return spec


def cuda(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.cuda(...)``, unchanged."""
    return obj.cuda(*args, **kwargs)


def inference_mode(mode: Any = True) -> Any:
    """``torch.inference_mode`` in a target: see :mod:`dmlpatch.rewriting.inference`."""
    from dmlpatch.rewriting import inference

    return inference.inference_mode(mode)


def autocast(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.autocast(...)`` and its aliases, unchanged."""
    return original(*args, **kwargs)


def load(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load(f)``, unchanged."""
    return original(*args, **kwargs)


def grad_scaler(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``GradScaler(...)``, unchanged."""
    return original(*args, **kwargs)


class _TorchCuda:
    """``torch.cuda`` itself, and ``x.type(T)`` unchanged."""

    @staticmethod
    def retype(obj: Any, *args: Any, **kwargs: Any) -> Any:
        return obj.type(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda, name)


torch_cuda = _TorchCuda()


def __getattr__(name: str) -> Any:
    """``torch.accelerator``, and any other routed ``torch.cuda.<name>``: the real ones."""
    import torch

    if name == "accelerator":
        return torch.accelerator
    return getattr(torch.cuda, name)
