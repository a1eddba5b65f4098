"""Fixes for PyTorch Lightning and Lightning Fabric: ``accelerator="dml"``.

Lightning fills each accelerator registry (Trainer's, Fabric's) by calling
``register_accelerators`` on the accelerator classes of one module; third-party accelerators
(Habana's ``hpu``, ...) add themselves to the same registry. DirectML is reached through
Lightning's own CUDA accelerator, whose device sites and device tests dmlpatch rewrites, so
``"dml"`` is that class under DirectML's name, in the registry of the module that has one, and
the Trainer's and Fabric's connectors take ``accelerator="dml"`` as ``"cuda"`` (they choose a
single device by the flag's name).

``16-mixed`` and ``bf16-mixed`` make ``torch.autocast`` and ``torch.amp.GradScaler`` for
``"cuda"``, sites that :mod:`dmlpatch.runtime.amp` serves on the DirectML device, as CUDA does;
only a run without DirectML's autocast kernels (float32) needs Fabric's batch left as it is.
"""

from __future__ import annotations

from typing import Any, Callable

Wrapper = Callable[..., Any]

#: The name users type, and what Lightning lists for it.
NAME = "dml"
DESCRIPTION = "DirectML adapters (torch-directml) through dmlpatch, as Lightning's CUDA accelerator"


def register_dml(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_register_classes(registry, method, module, base)`` and then ``"dml"`` in that registry,
    where ``module`` holds Lightning's CUDA accelerator."""
    result = wrapped(*args, **kwargs)
    registry = args[0] if args else kwargs.get("registry")
    method = args[1] if len(args) > 1 else kwargs.get("method")
    module = args[2] if len(args) > 2 else kwargs.get("module")
    if method != "register_accelerators":  # the strategies' registries are filled so too
        return result
    cuda = getattr(module, "CUDAAccelerator", None)
    # Lightning's registries are dicts with a register method.
    register = getattr(registry, "register", None)
    if cuda is not None and isinstance(registry, dict) and register and NAME not in registry:
        register(NAME, cuda, description=DESCRIPTION)
    return result


def dml_as_cuda(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The connector of a ``Trainer`` or ``Fabric`` made with ``accelerator="dml"``, made with
    ``"cuda"``: the adapters the program's CUDA devices map to."""
    accelerator = kwargs.get("accelerator")
    if isinstance(accelerator, str) and accelerator.lower() == NAME:
        kwargs = {**kwargs, "accelerator": "cuda"}
    return wrapped(*args, **kwargs)


def float32_inputs(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Fabric's ``16-mixed`` / ``bf16-mixed`` cast the batch to float16 (bfloat16) for autocast.
    Where DirectML's autocast kernels are installed, autocast runs on the device and the cast is
    Fabric's own; where they are not, autocast is off and the run is float32 (said once), so the
    batch stays as it is."""
    from dmlpatch.runtime import amp

    if amp.off_on_directml(getattr(instance, "device", None)):
        return args[0] if args else kwargs["data"]
    return wrapped(*args, **kwargs)
