"""The program's CUDA devices mapped onto the target: what ``'cuda'``, ``'cuda:1'``, ordinals
and ``torch.cuda``'s device functions mean in rewritten code.

The functions the rewriter routes ``torch.cuda.is_available()``, ``device_count()``,
``current_device()``, ``set_device()``, ``get_device_name()``, ``synchronize()`` and
``empty_cache()`` to, and :func:`device` for CUDA device literals, each answered from the
process's device resolution (where that is a usable CUDA GPU, each is the CUDA call it
replaced). Rewritten code reaches them through ``dmlpatch.runtime.sites``, which
re-exports them; ``dmlpatch.runtime.cuda_api`` and ``dmlpatch.runtime.accelerator`` build
on them here, so that the runtime can load those two on demand without their importing it back.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable, Optional, Union

from dmlpatch.devices import announce as _announce
from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import device_tests as _device_tests

_CUDA_SPEC = re.compile(r"^cuda(?::(\d+))?$")


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
    ordinal = ordinal_of(device)
    if ordinal is None or ordinal < 0:
        return  # CUDA ignores a negative ordinal (and None) here
    target_index(ordinal)
    _current_ordinal = ordinal


def get_device_name(device: Any = None) -> str:
    """``torch.cuda.get_device_name(i)`` in a target: the adapter's name."""
    cuda_module = _cuda()
    if cuda_module is not None:
        return str(cuda_module.get_device_name(device))
    resolution = _resolution.current()
    index = target_index(ordinal_of(device))
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
    try:
        if spec in _not_cuda:  # x.device, "cpu", a dtype: most values, seen before
            return spec
    except TypeError:  # unhashable: a map_location dict, a list
        return spec
    ordinal = cuda_ordinal(spec)
    if ordinal is NOT_CUDA:
        # Strings and torch.device only: True == 1 would make an ordinal look seen.
        if len(_not_cuda) < 256 and (spec.__class__ is str or _is_torch_device(spec)):
            _not_cuda.add(spec)
        return spec
    resolution = _resolution.current()
    if not resolution.patches_needed:
        return spec
    if not resolution.is_accelerator:
        _announce.device_used()
        return "cpu"
    target = f"{resolution.type}:{target_index(ordinal)}"
    _announce.device_used()
    if isinstance(spec, str) and (tracing is None or not tracing()):
        # Tested against "cuda" later, it answers as the program wrote it. Not in a graph
        # Dynamo traces: it keeps the answer as a constant, and a str subclass is none to it.
        return _device_tests.CudaSpelled(target, spec)
    return target


def device_argument(value: Any) -> Any:
    """Any value at a device parameter of a torch callable (``x.to(dev)``,
    ``torch.randn(2, device=cfg["dev"])``, ``torch.Generator(gpu)``), known only at run time.

    CUDA's names (``"cuda"``, ``"cuda:N"``, a CUDA ``torch.device``, an ordinal) become the
    target as :func:`device` makes them; everything else (``None``, a dtype, a tensor,
    ``"cpu"``, ``-1``, which libraries take for the CPU, the target itself) is returned
    untouched. Three identity tests decide most
    values: this runs at every ``.to(x)`` of a rewritten module.
    """
    # type(), not __class__: torch 2.4's Dynamo answers __class__ of a traced string with
    # something that is not str, and the check would pass "cuda" through a compiled forward.
    cls = type(value)
    if cls is str or cls is _device_class:
        if value in _not_cuda:  # "cpu", x.device: most values, seen before
            return value
        return device(value)
    if cls is int:
        return device(value) if value >= 0 else value
    if _device_class is None and cls is _torch_device():
        return device(value)
    return value


def device_keyword(value: Any) -> Any:
    """A value at a keyword named ``device`` of a callee that may not be torch's: CUDA's names
    as :func:`device_argument` answers them; an integer as it is (only torch is known to read
    one as CUDA's ordinal)."""
    if type(value) is int:
        return value
    return device_argument(value)


def map_location(value: Any) -> Any:
    """``torch.load(f, map_location)``'s value, known only at run time: a device as
    :func:`device_argument` answers it; a dict's targets likewise (its keys are the locations
    storages were saved at, as written); a function as it is."""
    if isinstance(value, dict):
        return {key: device_argument(target) for key, target in value.items()}
    return device_argument(value)


def device_type(value: Any) -> Any:
    """A device *type* where torch takes one (``torch.get_autocast_dtype("cuda")``,
    ``torch.Stream(device_type=...)``): ``"cuda"`` is the target's type on an accelerator;
    anything else, and ``"cuda"`` where the process runs on a CUDA GPU or the CPU, as it is."""
    if type(value) is not str or value != "cuda":
        return value
    resolution = _resolution.current()
    if not (resolution.patches_needed and resolution.is_accelerator):
        return value
    _announce.device_used()
    return resolution.type


def pin_memory_device(value: Any) -> Any:
    """``DataLoader(pin_memory_device=...)``: page-locked memory is CUDA's, so off CUDA a CUDA
    device there is ``""``, torch's default: torch 2.4 then pins nothing without CUDA, newer
    torches pin for the current accelerator. Anything else as it is."""
    if cuda_ordinal(value) is NOT_CUDA or not _resolution.current().patches_needed:
        return value
    return ""


_device_class: Any = None


def _torch_device() -> Any:
    """``torch.device`` once torch is imported (a value only torch makes cannot be one
    before)."""
    global _device_class
    if _device_class is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        _device_class = torch.device
    return _device_class


#: Whether Dynamo is tracing the caller (set by :mod:`dmlpatch.runtime.compiling` once the
#: program imports torch._dynamo; until then nothing can be tracing).
tracing: Optional[Callable[[], bool]] = None


#: Values :func:`device` found not to name a CUDA device (reading a torch.device's type costs
#: more than the call it guards; hashing it does not).
_not_cuda: set[Any] = set()

#: What :func:`cuda_ordinal` answers for a device that is not a CUDA one.
NOT_CUDA = object()


def cuda_ordinal(spec: Any) -> Any:
    """The CUDA ordinal ``spec`` names, None for plain ``cuda``, :data:`NOT_CUDA` otherwise."""
    if spec is None:
        return None
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec
    if isinstance(spec, str):
        match = _CUDA_SPEC.match(spec)
        if match is None:
            return NOT_CUDA
        return int(match.group(1)) if match.group(1) is not None else None
    if getattr(spec, "type", None) == "cuda":
        return spec.index
    return NOT_CUDA


def _is_torch_device(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and value.__class__ is torch.device


def ordinal_of(device: Any) -> Optional[int]:
    """The CUDA ordinal ``device`` names (None: the current one, or not a CUDA device)."""
    ordinal = cuda_ordinal(device)
    return None if ordinal is NOT_CUDA else ordinal


def target_index(ordinal: Optional[int]) -> int:
    """The target adapter behind the program's CUDA ordinal; CUDA's error for a bad one."""
    indices = _resolution.current().indices
    position = _current_ordinal if ordinal is None else ordinal
    if not 0 <= position < len(indices):
        raise RuntimeError(
            f"CUDA error: invalid device ordinal {position} "
            f"(dmlpatch maps {len(indices)} device(s): {_resolution.current().describe_indices()})"
        )
    return indices[position]
