"""torch.distributed and DistributedDataParallel on DirectML adapters, one process per adapter.

- ``init_process_group`` / ``new_group``: ``nccl`` (DirectML has none) becomes gloo with one
  warning; ``gloo`` and the default become gloo behind
  :class:`~dmlpatch.patches.torch.host_staged.HostStagedGloo`, which accepts DirectML tensors
  by staging them through the host.
- ``torchrun``: workers start through dmlpatch's runner, so the training script is rewritten.
- ``DistributedDataParallel``: for a model on a DirectML device, ``device_ids`` / ``output_device``
  name that device (they arrive as the program's CUDA ordinals), and the gradient buckets are
  averaged by :func:`~dmlpatch.patches.torch.host_staged.allreduce_hook`. A hook the program
  registers afterwards takes that hook's place instead of failing with "can only be called once".

Every fix leaves processes whose target is not DirectML, and models on other devices, alone.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from dmlpatch import log
from dmlpatch.devices import resolution
from dmlpatch.specs.arguments import bound_arguments

DEVICE_TYPE = "privateuseone"
_SLOT = "_dmlpatch_comm_hook"

Wrapper = Callable[..., Any]


def _targets_directml() -> bool:
    return resolution.current().type == DEVICE_TYPE


def _directml_backend(requested: Any, rank: Any = None) -> Any:
    """The backend a DirectML process gets for ``requested``; anything unknown passes through.

    The NCCL warning is said by rank 0 only (``rank`` as given, else ``$RANK``): one line per
    job, not one per rank.
    """
    from dmlpatch.patches.torch import host_staged

    text = "" if requested is None else str(requested).lower()
    devices: dict[str, str] = {}
    for part in text.split(","):
        device, colon, backend = part.partition(":")
        devices[device if colon else ""] = backend if colon else device
    if text and not set(devices.values()) <= {"gloo", "nccl", "undefined", ""}:
        return requested  # mpi, ucc, a custom backend: the program's own choice
    if "nccl" in devices.values() and _is_first_rank(rank):
        log.warn_once(
            "nccl",
            f"DirectML has no NCCL: backend {requested!r} becomes gloo, with DirectML tensors "
            "staged through the host",
        )
    return host_staged.register()


def _is_first_rank(rank: Any) -> bool:
    if rank is None or rank == -1:
        rank = os.environ.get("RANK", "0")
    return str(rank) == "0"


def init_process_group(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``dist.init_process_group(backend=...)``: a backend that can carry DirectML tensors."""
    if not _targets_directml():
        return wrapped(*args, **kwargs)
    bound = bound_arguments(wrapped, args, kwargs)
    bound.arguments["backend"] = _directml_backend(
        bound.arguments.get("backend"), bound.arguments.get("rank")
    )
    device_id = bound.arguments.get("device_id")
    if getattr(device_id, "type", None) == "privateuseone":
        # Binding the group to one device is NCCL's eager start (Lightning passes its root
        # device): gloo has no DirectML device to bind ("No backend type associated with device
        # type privateuseone"), and DirectML tensors reach it through the host anyway.
        bound.arguments["device_id"] = None
    return wrapped(*bound.args, **bound.kwargs)


def new_group(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``dist.new_group(backend=...)``: as for ``init_process_group`` (none: the default's)."""
    if not _targets_directml():
        return wrapped(*args, **kwargs)
    bound = bound_arguments(wrapped, args, kwargs)
    if bound.arguments.get("backend") is not None:
        bound.arguments["backend"] = _directml_backend(bound.arguments["backend"], _group_rank())
    return wrapped(*bound.args, **bound.kwargs)


def _group_rank() -> Any:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else None


class _HookSlot:
    """The state DDP passes to dmlpatch's hook: the group, and a hook the program chose."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.program_hook: Optional[tuple[Any, Callable[..., Any]]] = None


def _dispatch(slot: _HookSlot, bucket: Any) -> Any:
    if slot.program_hook is not None:
        state, hook = slot.program_hook
        return hook(state, bucket)
    from dmlpatch.patches.torch import host_staged

    return host_staged.allreduce_hook(slot.group, bucket)


_dispatch.__annotations__ = {}  # as host_staged.allreduce_hook's, for DDP's annotation check


def _single_directml_device(module: Any) -> Any:
    devices = {p.device for p in module.parameters()}
    if len(devices) == 1:
        (device,) = devices
        if device.type == DEVICE_TYPE:
            return device
    return None


def ddp_init(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``DistributedDataParallel(model, device_ids=[rank], ...)`` for a model on DirectML."""
    bound = bound_arguments(wrapped, args, kwargs)
    device = _single_directml_device(bound.arguments["module"])
    if device is None:
        return wrapped(*args, **kwargs)
    # The program names its CUDA ordinal (rank); the model already sits on that ordinal's
    # adapter, which is what DDP means by it.
    if bound.arguments.get("device_ids"):
        bound.arguments["device_ids"] = [device.index]
    if bound.arguments.get("output_device") is not None:
        bound.arguments["output_device"] = device.index
    if bound.arguments.get("find_unused_parameters"):
        # The reducer copies its "used parameters" map through pinned host memory
        # (reducer.cpp asserts local_used_map_tmp.is_pinned()), which DirectML cannot pin.
        bound.arguments["find_unused_parameters"] = False
        if _is_first_rank(_group_rank()):
            log.warn_once(
                "find_unused_parameters",
                "DDP's find_unused_parameters=True needs pinned host memory, which DirectML "
                "does not have: running with False (a parameter left without a gradient then "
                "stops DDP at the next step, naming it)",
            )
    wrapped(*bound.args, **bound.kwargs)
    from dmlpatch.patches.torch import host_staged

    if isinstance(instance.process_group, host_staged.HostStagedGloo):
        slot = _HookSlot(instance.process_group)
        instance.register_comm_hook(slot, _dispatch)
        setattr(instance, _SLOT, slot)
    return None


def register_comm_hook(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``ddp.register_comm_hook(state, hook)`` after dmlpatch's: the program's hook takes over."""
    slot = getattr(instance, _SLOT, None)
    if slot is None or slot.program_hook is not None:
        return wrapped(*args, **kwargs)
    bound = bound_arguments(wrapped, args, kwargs)
    hook = bound.arguments["hook"]
    instance._check_comm_hook(hook)
    slot.program_hook = (bound.arguments["state"], hook)
    return None


def register_builtin_comm_hook(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``ddp._register_builtin_comm_hook(type)`` after dmlpatch's: the Python twin takes over."""
    slot = getattr(instance, _SLOT, None)
    if slot is None or slot.program_hook is not None:
        return wrapped(*args, **kwargs)
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    kind = bound_arguments(wrapped, args, kwargs).arguments["comm_hook_type"]
    if kind == dist.BuiltinCommHookType.FP16_COMPRESS:
        slot.program_hook = (instance.process_group, default_hooks.fp16_compress_hook)
    # ALLREDUCE is what dmlpatch's hook does already.
    return None


def torchrun_workers(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """torchrun's ``launch_agent``: workers run ``python -u -m dmlpatch script.py``.

    torchrun starts each worker as plain ``python -u script.py``; the worker then starts
    patched (its libraries are), but the script itself would run unrewritten, so its own
    ``torch.cuda.set_device(local_rank)`` and ``.cuda()`` would ask for CUDA. Started through
    dmlpatch's runner it is rewritten as under ``python -m dmlpatch``. (``launch_agent``, not
    ``config_from_args``: under ``python -m torch.distributed.run`` the latter runs in a
    ``__main__`` copy of the module.)
    """
    bound = bound_arguments(wrapped, args, kwargs)
    entrypoint, worker_args = bound.arguments["entrypoint"], list(bound.arguments["args"])
    if (
        isinstance(entrypoint, str)
        and worker_args[:1] == ["-u"]
        and worker_args[1:3] != ["-m", "dmlpatch"]
        and _targets_directml()
    ):
        bound.arguments["args"] = ["-u", "-m", "dmlpatch", *worker_args[1:]]
    return wrapped(*bound.args, **bound.kwargs)
