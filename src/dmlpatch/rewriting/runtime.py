"""What rewritten code calls instead of CUDA.

The rewriter (``dmlpatch.rewriting.sites``) turns CUDA device sites inside target modules into calls
of the functions below, through one module-level alias, so rewritten code stays readable::

    torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    # becomes
    torch.device(__dmlpatch__.device('cuda') if __dmlpatch__.is_available() else 'cpu')

Every answer comes from the process's device resolution (``dmlpatch.devices.resolution.current``).
Where that is a usable CUDA GPU, each function is the CUDA call it replaced: modules may be
rewritten before the device is known (resolving it imports torch), and must then behave as written.
Nothing here is imported by ``import dmlpatch``; torch is touched only when rewritten code runs.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Optional, Union

from dmlpatch.devices import announce as _announce
from dmlpatch.devices import resolution as _resolution

#: The name under which rewritten modules see this module.
ALIAS = "__dmlpatch__"
#: The name under which they see ``dmlpatch.rewriting.runtime_as_written``, for the functions
#: that keep CUDA's meaning (see ``dmlpatch.rewriting.sites``).
KEPT_ALIAS = "__dmlpatch_kept__"

_CUDA_SPEC = re.compile(r"^cuda(?::(\d+))?$")

#: ``torch.cuda.<name>(...)`` calls the rewriter routes here; anything else is left alone.
CUDA_FUNCTIONS = frozenset(
    {
        "is_available",
        "device_count",
        "current_device",
        "set_device",
        "get_device_name",
        "synchronize",
        "empty_cache",
    }
)

#: ``torch.cuda`` names that rewritten code may keep using as they are: without a CUDA GPU they
#: work, answer "nothing", or switch themselves off, exactly as under plain python (checked on
#: torch 2.4.1 and 2.14.1). ``amp`` is one: its autocast and GradScaler calls are sites of their
#: own. Names in ``cuda_api.NAMES`` are answered there. Any other ``torch.cuda`` name in a
#: function with device sites would fail once its sites say "CUDA is available" (``Found no
#: NVIDIA driver``), so such a function keeps CUDA's meaning (see ``dmlpatch.rewriting.sites``).
HARMLESS_CUDA_NAMES = frozenset(
    {
        "amp",
        "OutOfMemoryError",
        "is_initialized",
        "get_arch_list",
        "CudaError",
        "DeferredCudaCallError",
        "has_half",
        "has_magma",
        "get_gencode_flags",
    }
)


def _cuda() -> Any:
    """``torch.cuda`` when the process runs on a usable CUDA GPU (no patches), else None."""
    if _resolution.current().patches_needed:
        return None
    import torch

    return torch.cuda


def is_available() -> bool:
    """``torch.cuda.is_available()`` in a target: is the target an accelerator?"""
    resolution = _resolution.current()
    if not resolution.patches_needed:
        return bool(_cuda().is_available())
    return resolution.is_accelerator


def device_count() -> int:
    """``torch.cuda.device_count()`` in a target: adapters the program may use."""
    resolution = _resolution.current()
    if not resolution.patches_needed:
        return int(_cuda().device_count())
    return len(resolution.indices) if resolution.is_accelerator else 0


#: The program's CUDA ordinal that ``'cuda'``, ``.cuda()`` and ``current_device()`` mean, as
#: ``torch.cuda.set_device`` sets it: DDP ranks call ``set_device(local_rank)`` and then
#: ``.cuda()``, expecting their own adapter. Per process, like CUDA's (not per thread: a
#: program's worker threads share it there too, until they call set_device themselves).
_current_ordinal = 0


def current_device() -> int:
    """``torch.cuda.current_device()`` in a target: the ordinal ``set_device`` chose (0)."""
    cuda_module = _cuda()
    if cuda_module is not None:
        return int(cuda_module.current_device())
    return _current_ordinal


def set_device(device: Any) -> None:
    """``torch.cuda.set_device(i)`` in a target: later ``'cuda'`` / ``.cuda()`` mean ordinal i."""
    global _current_ordinal
    cuda_module = _cuda()
    if cuda_module is not None:
        cuda_module.set_device(device)
        return
    ordinal = _ordinal(device)
    if ordinal is None or ordinal < 0:
        return  # CUDA ignores a negative ordinal (and None) here
    _target_index(ordinal)
    _current_ordinal = ordinal


def get_device_name(device: Any = None) -> str:
    """``torch.cuda.get_device_name(i)`` in a target: the adapter's name."""
    cuda_module = _cuda()
    if cuda_module is not None:
        return str(cuda_module.get_device_name(device))
    resolution = _resolution.current()
    index = _target_index(_ordinal(device))
    return resolution.adapter_name(index)


def synchronize(device: Any = None) -> None:
    """``torch.cuda.synchronize()`` in a target: wait for the target's queue."""
    cuda_module = _cuda()
    if cuda_module is not None:
        cuda_module.synchronize(device)
        return
    resolution = _resolution.current()
    if resolution.backend == "directml":
        import torch

        # torch-directml has no synchronize(); a device-to-host read drains its queue.
        torch.zeros(1, device=resolution.device).cpu()


def empty_cache() -> None:
    """``torch.cuda.empty_cache()`` in a target: nothing to release off CUDA (torch-directml's
    allocator keeps no cache to empty from Python)."""
    cuda_module = _cuda()
    if cuda_module is not None:
        cuda_module.empty_cache()


def device(spec: Union[str, int, Any, None] = "cuda") -> Any:
    """A CUDA device literal in a target (``'cuda'``, ``'cuda:1'``, ``f'cuda:{i}'``) → the target.

    Values that do not name a CUDA device are returned unchanged, so a rewritten f-string that
    turns out to say ``'cpu'`` at run time still means the CPU.
    """
    ordinal = _cuda_ordinal(spec)
    if ordinal is _NOT_CUDA:
        return spec
    resolution = _resolution.current()
    if not resolution.patches_needed:
        return spec
    if not resolution.is_accelerator:
        _announce.device_used()
        return "cpu"
    target = f"{resolution.type}:{_target_index(ordinal)}"
    _announce.device_used()
    return target


def cuda(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.cuda(...)`` in a target → ``obj.to(target)``; an object without ``to`` keeps its own
    ``cuda``.

    Tensors, modules and storages get keywords (``UntypedStorage.to`` accepts only ``device=`` /
    ``non_blocking=``). Any other object with its own ``to`` (spandrel's ``ModelDescriptor``,
    ``PackedSequence``, transformers' ``BatchEncoding``, a user's container) gets the device as
    its first argument, as each documents it, and of the program's other arguments only those
    its ``to`` accepts: it moves as its own ``cuda()`` would have moved it to a GPU.
    """
    mover = getattr(obj, "to", None)
    if mover is None or not _resolution.current().patches_needed:
        return obj.cuda(*args, **kwargs)
    import torch

    options = dict(kwargs)
    spec = args[0] if args else options.pop("device", None)
    if len(args) > 1:
        options["non_blocking"] = args[1]
    # A torch.device, not its string: torch 2.4's UntypedStorage.to reads `device.type`.
    target = torch.device(globals()["device"](spec if spec is not None else "cuda"))
    if isinstance(obj, torch.nn.Module):
        return mover(device=target)
    if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
        return mover(device=target, **options)
    return mover(target, **_accepted(mover, options))


def _accepted(function: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``options`` that ``function`` takes (all, with ``**kwargs``)."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the device alone
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return options
    return {name: value for name, value in options.items() if name in parameters}


def inference_mode(mode: Any = True) -> Any:
    """``torch.inference_mode`` in a target: see :mod:`dmlpatch.rewriting.inference`."""
    from dmlpatch.rewriting import inference

    return inference.inference_mode(mode)


def autocast(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.autocast(...)`` and its aliases in a target: see :mod:`dmlpatch.rewriting.amp`."""
    from dmlpatch.rewriting import amp

    return amp.autocast(original, *args, **kwargs)


def grad_scaler(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``GradScaler(...)`` in a target: see :mod:`dmlpatch.rewriting.amp`."""
    from dmlpatch.rewriting import amp

    return amp.grad_scaler(original, *args, **kwargs)


def load(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load(f)`` in a target, with no ``map_location``: storages a CUDA machine saved
    (``cuda:N``) are restored on the target, as CUDA would restore them on its GPU; others
    (``cpu``) as saved."""
    resolution = _resolution.current()
    if not resolution.patches_needed:
        return original(*args, **kwargs)
    from torch.serialization import default_restore_location

    def restore(storage: Any, location: str) -> Any:
        if _cuda_ordinal(location) is _NOT_CUDA:
            return None  # torch's own restore
        return default_restore_location(storage, device(location))

    return original(*args, map_location=restore, **kwargs)


_OPERATORS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


def with_complex(symbol: str, left: Any, right: Any) -> Any:
    """``left <symbol> right`` where one side is a complex literal (``mag * (x + 1j * y)``).

    DirectML has no complex type: a real DirectML tensor meeting a complex number would make a
    complex DirectML tensor, which stops the process. Such a tensor is first made a complex
    one of dmlpatch's (``dmlpatch.opfix.complex``, pairs of reals on the device); every other
    operand is left as it is.
    """
    operation = _OPERATORS[symbol]
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(left, torch.Tensor):
            left = _complex_on_device(torch, left)
        elif isinstance(right, torch.Tensor):
            right = _complex_on_device(torch, right)
    return operation(left, right)


def _complex_on_device(torch: Any, value: Any) -> Any:
    if value.device.type != "privateuseone" or value.is_complex():
        return value
    from dmlpatch.opfix import dtype_policy

    policy = dtype_policy.current()
    if policy is None or not policy.paired(torch.complex64):
        return value
    real = value if value.is_floating_point() else value.to(torch.get_default_dtype())
    return torch.complex(real, torch.zeros_like(real))


def __getattr__(name: str) -> Any:
    """``__dmlpatch__.torch_cuda`` (:mod:`dmlpatch.rewriting.cuda_api`) and
    ``__dmlpatch__.accelerator`` (:mod:`dmlpatch.rewriting.accelerator`), loaded when used."""
    if name == "torch_cuda":
        from dmlpatch.rewriting import cuda_api

        return cuda_api
    if name == "accelerator":
        from dmlpatch.rewriting import accelerator

        return accelerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_NOT_CUDA = object()


def _cuda_ordinal(spec: Any) -> Any:
    if spec is None:
        return None
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec
    if isinstance(spec, str):
        match = _CUDA_SPEC.match(spec)
        if match is None:
            return _NOT_CUDA
        return int(match.group(1)) if match.group(1) is not None else None
    if getattr(spec, "type", None) == "cuda":
        return spec.index
    return _NOT_CUDA


def _ordinal(device: Any) -> Optional[int]:
    ordinal = _cuda_ordinal(device)
    return None if ordinal is _NOT_CUDA else ordinal


def _target_index(ordinal: Optional[int]) -> int:
    """The target adapter behind the program's CUDA ordinal; CUDA's error for a bad one."""
    indices = _resolution.current().indices
    position = _current_ordinal if ordinal is None else ordinal
    if not 0 <= position < len(indices):
        raise RuntimeError(
            f"CUDA error: invalid device ordinal {position} "
            f"(dmlpatch maps {len(indices)} device(s): {_resolution.current().describe_indices()})"
        )
    return indices[position]
