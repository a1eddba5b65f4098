"""What the functions dmlpatch cannot make consistent call instead of CUDA: CUDA itself, as written.

The rewriter (``dmlpatch.rewriting.transform``) routes the sites of a function here instead of to
``dmlpatch.runtime.sites`` when the function also uses a ``torch.cuda`` name the runtime does
not answer (``torch.cuda.jiterator``, ``nccl``, the caching allocator...): told that CUDA is
available, it would reach that call and fail where plain python ran on the CPU. The rest of its
module is rewritten as usual. So every function here does exactly what the CUDA call it replaced
does; only ``is_available()``, the moment such a function decides where to run, also says, once
per function, that it stays where plain python would put it. A function that never asks says
nothing: importing a module whose CUDA-only helper is never used is not news.
"""

from __future__ import annotations

import sys
from typing import Any


def is_available(scope: str = "", uses: tuple[str, ...] = ()) -> bool:
    """``torch.cuda.is_available()``, plus one line naming the function that asked (``scope``
    in its module) and the first of the unanswered names it ``uses``."""
    if uses:
        from dmlpatch import log

        where = _where(scope)
        log.warn_once(
            f"as-written:{where}",
            f"{where} chooses its device as under plain python: it uses "
            f"{_used(uses)}, which dmlpatch cannot answer off CUDA",
        )
    import torch

    return bool(torch.cuda.is_available())


def _where(scope: str) -> str:
    """The function that asked, in its module (two frames up: past the public function)."""
    module = sys._getframe(2).f_globals.get("__name__", "?")
    return f"{module}.{scope}" if scope and scope != "<module>" else module


def _used(uses: tuple[str, ...]) -> str:
    """The first name that kept the function, qualified; how many more."""
    from dmlpatch.runtime import cuda_only

    first = cuda_only.qualified(uses[0])
    more = f" (and {len(uses) - 1} more)" if len(uses) > 1 else ""
    return first + more


def _names_accelerator(value: Any) -> bool:
    """A device, device type or device name that is neither CUDA nor the CPU."""
    kind = value if isinstance(value, str) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return False
    return kind.split(":", 1)[0] in ("privateuseone", "mps", "xpu")


def as_cuda(value: Any, scope: str = "", uses: tuple[str, ...] = ()) -> Any:
    """A device (or its type, or its name) tested against ``"cuda"``, unchanged: a test that
    finds the DirectML adapter (or another accelerator dmlpatch gave) says once that it answers
    as under plain python."""
    if uses and _names_accelerator(value):
        from dmlpatch import log

        where = _where(scope)
        log.warn_once(
            f"as-written-test:{where}",
            f"{where} tests its device as under plain python (not CUDA): it uses "
            f"{_used(uses)}, which dmlpatch cannot answer off CUDA",
        )
    return value


def is_cuda(obj: Any) -> bool:
    """``obj.is_cuda``, unchanged."""
    return bool(obj.is_cuda)


def device(spec: Any = "cuda") -> Any:
    """A CUDA device literal, unchanged."""
    return spec


def device_argument(value: Any) -> Any:
    """A value at a device parameter, unchanged."""
    return value


map_location = device_type = pin_memory_device = device_keyword = device_argument


def queue(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.Stream(...)`` / ``torch.Event(...)``, unchanged."""
    return original(*args, **kwargs)


def cuda(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.cuda(...)``, unchanged."""
    return obj.cuda(*args, **kwargs)


def pin_memory(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.pin_memory(...)``, unchanged."""
    return obj.pin_memory(*args, **kwargs)


def inference_mode(mode: Any = True) -> Any:
    """``torch.inference_mode`` in a target: see :mod:`dmlpatch.runtime.inference`."""
    from dmlpatch.runtime import inference

    return inference.inference_mode(mode)


def autocast(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.autocast(...)`` and its aliases, unchanged (torch's warnings name the program's
    line)."""
    from dmlpatch.runtime import on_behalf

    return on_behalf.call(original, args, kwargs)


def load(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load(f)``, unchanged (torch's warnings name the program's line)."""
    from dmlpatch.runtime import on_behalf

    return on_behalf.call(original, args, kwargs)


def grad_scaler(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``GradScaler(...)``, unchanged (torch's warnings name the program's line)."""
    from dmlpatch.runtime import on_behalf

    return on_behalf.call(original, args, kwargs)


def custom_amp(original: Any) -> Any:
    """``torch.cuda.amp.custom_fwd`` / ``custom_bwd``, unchanged."""
    return original


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
