"""What rewritten code calls instead of CUDA.

The rewriter (``dmlpatch.rewriting.transform``) turns CUDA device sites inside target modules
into calls of the functions below, through one module-level alias, so rewritten code stays
readable::

    torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    # becomes
    torch.device(__dmlpatch__.device('cuda') if __dmlpatch__.is_available() else 'cpu')

The device functions (``is_available``, ``device`` and the rest of ``torch.cuda``'s device API)
live in ``dmlpatch.runtime.cuda_device`` and are re-exported here. Every answer comes from the
process's device resolution (``dmlpatch.devices.resolution.current``).
Where that is a usable CUDA GPU, each function is the CUDA call it replaced: modules may be
rewritten before the device is known (resolving it imports torch), and must then behave as written.
Nothing here is imported by ``import dmlpatch``; torch is touched only when rewritten code runs.
"""

from __future__ import annotations

import sys
from typing import Any

from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import ALIAS as ALIAS  # the name rewritten modules see this module by
from dmlpatch.runtime import KEPT_ALIAS as KEPT_ALIAS
from dmlpatch.runtime import cuda_device as _cuda_device
from dmlpatch.runtime import on_behalf
from dmlpatch.runtime.cuda_device import current_device as current_device
from dmlpatch.runtime.cuda_device import device as device
from dmlpatch.runtime.cuda_device import device_argument as device_argument
from dmlpatch.runtime.cuda_device import device_count as device_count
from dmlpatch.runtime.cuda_device import device_keyword as device_keyword
from dmlpatch.runtime.cuda_device import device_type as device_type
from dmlpatch.runtime.cuda_device import empty_cache as empty_cache
from dmlpatch.runtime.cuda_device import get_device_name as get_device_name
from dmlpatch.runtime.cuda_device import is_available as is_available
from dmlpatch.runtime.cuda_device import map_location as map_location
from dmlpatch.runtime.cuda_device import pin_memory_device as pin_memory_device
from dmlpatch.runtime.cuda_device import set_device as set_device
from dmlpatch.runtime.cuda_device import synchronize as synchronize
from dmlpatch.runtime.device_tests import as_cuda as as_cuda
from dmlpatch.runtime.device_tests import is_cuda as is_cuda

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
#: NVIDIA driver``), so such a function keeps CUDA's meaning (see ``dmlpatch.rewriting.transform``).
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


def cuda(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.cuda(...)`` in a target → ``obj.to(target)``; an object without ``to`` keeps its own
    ``cuda``.

    Tensors, modules and storages get keywords (``UntypedStorage.to`` accepts only ``device=`` /
    ``non_blocking=``). Any other object with its own ``to`` (spandrel's ``ModelDescriptor``,
    ``PackedSequence``, transformers' ``BatchEncoding``, a user's container) gets the device as
    its first argument, as each documents it, and of the program's other arguments only those
    its ``to`` accepts: it moves as its own ``cuda()`` would have moved it to a GPU.
    """
    if not patches_needed():
        return obj.cuda(*args, **kwargs)
    import torch

    # Tensors are asked nothing first: torch 2.4's Dynamo cannot trace hasattr on one.
    moves_itself = isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage))
    if not moves_itself and getattr(obj, "to", None) is None:
        return obj.cuda(*args, **kwargs)
    options = dict(kwargs)
    spec = args[0] if args else options.pop("device", None)
    if len(args) > 1:
        options["non_blocking"] = args[1]
    # A torch.device, not its string: torch 2.4's UntypedStorage.to reads `device.type`.
    target = torch.device(device(spec if spec is not None else "cuda"))
    if moves_itself:
        return obj.to(device=target, **options)
    if isinstance(obj, torch.nn.Module):
        return obj.to(device=target)
    return obj.to(target, **_accepted(obj.to, options))


def patches_needed() -> bool:
    """Whether the process runs off CUDA (a function of its own: Dynamo takes it as a constant,
    see :mod:`dmlpatch.runtime.compiling`)."""
    return _resolution.current().patches_needed


def pin_memory(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.pin_memory(...)`` in a target. Page-locked host memory serves copies to a CUDA GPU,
    and torch 2.4 (torch-directml's torch) pins for CUDA whatever the device: without a CUDA
    driver the call fails. Elsewhere a CPU tensor or storage gets what ``pin_memory`` returns
    for an unpinned one, a copy, in ordinary memory (a non-blocking copy from it to the device
    is a blocking one); anything else, a device tensor included, keeps its own method."""
    import torch

    if _resolution.current().patches_needed and (
        isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage))
        and obj.device.type == "cpu"
    ):
        return obj.clone()
    return obj.pin_memory(*args, **kwargs)


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
    """``torch.inference_mode`` in a target: see :mod:`dmlpatch.runtime.inference`."""
    from dmlpatch.runtime import inference

    return inference.inference_mode(mode)


def autocast(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.autocast(...)`` and its aliases in a target: see :mod:`dmlpatch.runtime.amp`."""
    from dmlpatch.runtime import amp

    return amp.autocast(original, *args, **kwargs)


def grad_scaler(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``GradScaler(...)`` in a target: see :mod:`dmlpatch.runtime.amp`."""
    from dmlpatch.runtime import amp

    return amp.grad_scaler(original, *args, **kwargs)


def custom_amp(original: Any) -> Any:
    """``torch.cuda.amp.custom_fwd`` / ``custom_bwd`` in a target, as a decorator or called:
    see :mod:`dmlpatch.runtime.amp`."""
    from dmlpatch.runtime import amp

    return amp.custom_amp(original)


def queue(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.Stream(...)`` / ``torch.Event(...)`` in a target (torch >= 2.3's device-agnostic
    queues). DirectML has one queue per adapter and no streams or events of its own
    (``Backend doesn't support create a new Stream``): on the adapter they are
    ``torch.cuda.Stream``'s and ``Event``'s answers (:mod:`dmlpatch.runtime.cuda_api`); on
    any other device torch's own."""
    resolution = _resolution.current()
    if not (resolution.patches_needed and resolution.is_accelerator):
        return original(*args, **kwargs)
    import torch

    spec = _cuda_device.device_argument(args[0] if args else kwargs.get("device"))
    if spec is not None and torch.device(spec).type != resolution.type:
        return original(*args, **kwargs)
    from dmlpatch.runtime import cuda_api

    if original is getattr(torch, "Event", None):
        options = {k: v for k, v in kwargs.items() if k != "device"}
        return cuda_api.Event(**options)
    priority = args[1] if len(args) > 1 else kwargs.get("priority", 0)
    return cuda_api.Stream(spec, priority)


def load(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load(f)`` in a target, with no ``map_location``: storages a CUDA machine saved
    (``cuda:N``) are restored on the target, as CUDA would restore them on its GPU; others
    (``cpu``) as saved."""
    resolution = _resolution.current()
    if not resolution.patches_needed:
        return on_behalf.call(original, args, kwargs)
    from torch.serialization import default_restore_location

    def restore(storage: Any, location: str) -> Any:
        if _cuda_device.cuda_ordinal(location) is _cuda_device.NOT_CUDA:
            return None  # torch's own restore
        return default_restore_location(storage, device(location))

    return on_behalf.call(original, args, {**kwargs, "map_location": restore})


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
    """``__dmlpatch__.torch_cuda`` (:mod:`dmlpatch.runtime.cuda_api`) and
    ``__dmlpatch__.accelerator`` (:mod:`dmlpatch.runtime.accelerator`), loaded when used."""
    if name == "torch_cuda":
        from dmlpatch.runtime import cuda_api

        return cuda_api
    if name == "accelerator":
        from dmlpatch.runtime import accelerator

        return accelerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
