"""Fixes for ultralytics (YOLO): DirectML device requests, AMP, device queries, timing, loaders.

How ``device=`` is read once these fixes are in (``select_device``):

- ``dml``, ``dml:N``, ``privateuseone``, ``privateuseone:N`` (any case): DirectML adapter ``N``
  (default: dmlpatch's target adapter), on the backend dmlpatch resolved for this process —
  real DirectML, or the simulated device under ``--device sim`` / ``DMLPATCH_DEVICE=sim``.
  When dmlpatch's target is not DirectML the request fails with one line naming the reason.
- ``sim``, ``sim:N``: the simulated DirectML device, loaded on demand when dmlpatch's target is
  not already DirectML (so ``device=sim`` works wherever the simulator can be built).
- CUDA requests (``''``, ``0``, ``cuda``, ``cuda:N``) while dmlpatch targets DirectML: the
  target, as for every rewritten ``torch.cuda`` site; program ordinal ``N`` is the target's
  ``N``-th adapter.
- Several adapters (``dml:0,1``, or ``0,1`` under ``--device dml:0,1``): ultralytics' DDP
  training, one rank per adapter over gloo (:func:`setup_ddp`, and
  ``dmlpatch.patches.torch.distributed`` for the process group and DDP itself).
- Everything else (``cpu``, ``mps``, …) is ultralytics' own business.

The other fixes act only on ``privateuseone`` devices and leave every other device as it was.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch

from dmlpatch.devices import announce, resolution
from dmlpatch.runtime import inference
from dmlpatch.runtime import sites as runtime
from dmlpatch.specs.arguments import bound_arguments

DEVICE_TYPE = "privateuseone"

_DML_REQUEST = re.compile(r"^(dml|privateuseone|sim)(?::([^:]*))?$")
_CUDA_REQUEST = re.compile(r"^(?:cuda)?(?::)?([\d,]*)$")

_lock = threading.Lock()
_current_index = 0  # the adapter select_device chose last (ultralytics' "current device")

Wrapper = Callable[..., Any]


def _is_directml(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == DEVICE_TYPE
    return isinstance(device, str) and device.split(":", 1)[0] == DEVICE_TYPE


# -- device selection ----------------------------------------------------------------------


def select_device(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``select_device``: DirectML requests return ``privateuseone:N`` and log the adapter."""
    bound = bound_arguments(wrapped, args, kwargs)
    request = bound.arguments["device"]
    chosen = directml_request(request)
    if chosen is None:
        return wrapped(*args, **kwargs)
    global _current_index
    with _lock:
        _current_index = chosen.index or 0
    announce.device_used()
    if bound.arguments.get("verbose", True):
        _log_selection(wrapped, chosen, bool(bound.arguments.get("newline", False)))
    return chosen


def directml_request(request: Any) -> Optional[torch.device]:
    """The DirectML device a request means, None for requests ultralytics handles itself."""
    if isinstance(request, torch.device):
        if request.type == DEVICE_TYPE:
            return _adapter(f"{request}", "dml", request.index)
        text = "" if request.type == "cuda" and request.index is None else str(request)
    elif isinstance(request, (list, tuple)):
        text = ",".join(str(part) for part in request)
    else:
        text = "" if request is None else str(request)
    text = text.strip().lower().replace(" ", "")
    text = "" if text == "none" else text
    match = _DML_REQUEST.match(text)
    if match is not None:
        kind, selector = match.groups()
        kind = "sim" if kind == "sim" else "dml"
        if selector is not None and re.fullmatch(r"\d+(,\d+)+", selector):
            return _this_rank([_adapter(text, kind, int(part)) for part in selector.split(",")])
        if selector is not None and not selector.isdigit():
            _invalid(text, f"'{selector}' is not an adapter number")
        index = int(selector) if selector is not None else None
        return _adapter(text, kind, index)
    cuda = _CUDA_REQUEST.match(text)
    target = resolution.current()
    if cuda is None or target.type != DEVICE_TYPE:
        return None
    ordinals = [part for part in cuda.group(1).split(",") if part] or ["0"]
    # The program's CUDA ordinal N is the target's N-th adapter, as in rewritten code.
    for position in map(int, ordinals):
        if position >= len(target.indices):
            _invalid(
                text,
                f"dmlpatch maps {len(target.indices)} adapter(s) as CUDA devices "
                f"({target.describe_indices()}); use 'device=0' or 'device=dml', or select "
                "several adapters with dmlpatch --device dml:0,1",
            )
    return _this_rank([torch.device(DEVICE_TYPE, target.indices[int(o)]) for o in ordinals])


def _this_rank(adapters: list[torch.device]) -> torch.device:
    """Several adapters mean DDP: the launching process gets the first, DDP rank r the r-th.

    ultralytics' own select_device does the same for ``device=0,1`` through CUDA's current
    device, which each rank sets in ``_setup_ddp`` (see :func:`setup_ddp`).
    """
    rank = int(os.environ.get("LOCAL_RANK", "-1"))
    return adapters[rank] if 0 <= rank < len(adapters) else adapters[0]


def _adapter(text: str, kind: str, index: Optional[int]) -> torch.device:
    """Check a DirectML/simulator request against the adapters this process can use."""
    target = resolution.current()
    names = _adapter_names(text, kind, target)
    if index is None:
        index = target.indices[0] if target.type == DEVICE_TYPE else 0
    if not 0 <= index < len(names):
        listed = ", ".join(f"dml:{i} = {name}" for i, name in enumerate(names))
        _invalid(
            text,
            f"only {len(names)} DirectML adapter(s) available ({listed}); "
            f"valid: 'device=dml' or 'device=dml:0'"
            + (f" to 'device=dml:{len(names) - 1}'" if len(names) > 1 else ""),
        )
    return torch.device(DEVICE_TYPE, index)


def _adapter_names(text: str, kind: str, target: resolution.Resolution) -> list[str]:
    if target.backend == "sim" or (kind == "sim" and target.backend != "directml"):
        from dmlpatch import sim
        from dmlpatch.errors import DeviceUnavailable

        try:
            sim.load()
        except DeviceUnavailable as error:
            _invalid(text, f"the simulated DirectML device cannot be used: {error}")
        return [sim.device_name(i) for i in range(sim.device_count())]
    if kind == "sim":
        _invalid(
            text,
            "this process runs on real DirectML, which owns the privateuseone backend; "
            "use 'device=dml'",
        )
    if target.backend == "directml":
        from dmlpatch.devices import directml

        return list(directml.probe().names)
    _invalid(
        text,
        f"dmlpatch runs this process on {target.device} ({target.why}). "
        "Use 'device=cpu', or 'device=sim' for the simulated DirectML device",
    )
    raise AssertionError("unreachable")


def _invalid(text: str, reason: str) -> None:
    raise ValueError(f"Invalid DirectML 'device={text}' requested: {reason}.")


def _log_selection(wrapped: Wrapper, device: torch.device, newline: bool) -> None:
    """One line like ultralytics' own ``... torch-2.x CUDA:0 (Tesla T4, 15102MiB)``."""
    namespace = wrapped.__globals__
    version = namespace.get("__version__", "")
    python = namespace.get("PYTHON_VERSION", "")
    logger = namespace.get("LOGGER")
    # 8.0/8.1 wrote "Ultralytics YOLOv8.1.47", 8.2+ "Ultralytics 8.4.190".
    product = f"YOLOv{version}" if version.startswith(("8.0.", "8.1.")) else version
    line = (
        f"Ultralytics {product} 🚀 Python-{python} torch-{torch.__version__} "
        f"DML:{device.index} ({adapter_name(device.index or 0)})"
    )
    if logger is not None:
        logger.info(line + "\n" if newline else line)


def adapter_name(index: int) -> str:
    module = getattr(torch, DEVICE_TYPE, None)
    try:
        return str(module.device_name(index)) if module is not None else f"DirectML {index}"
    except Exception:  # torch-directml raises bare Exceptions for bad ids
        return f"DirectML {index}"


# -- device queries ------------------------------------------------------------------------


class DirectMLBackend:
    """What ultralytics asks a device module (``torch.cuda`` style), answered for DirectML.

    torch-directml's ``torch.privateuseone`` module has ``device_count``, ``device_name`` and
    ``gpu_memory`` (MB in use per memory tile) but no ``synchronize``, ``set_device``,
    ``memory_reserved``, ``get_device_properties`` or ``empty_cache``; those are answered
    here, and anything else is passed through to the module.
    """

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def is_available(self) -> bool:
        return bool(self._module.is_available())

    def device_count(self) -> int:
        return int(self._module.device_count())

    def current_device(self) -> int:
        return _current_index

    def set_device(self, device: Any) -> None:
        global _current_index
        with _lock:
            _current_index = _index(device)

    def get_device_name(self, device: Any = None) -> str:
        return adapter_name(_index(device))

    def synchronize(self, device: Any = None) -> None:
        synchronize()

    def memory_reserved(self, device: Any = None) -> int:
        """Bytes in use on the adapter (torch-directml reports MB per tile; no cache of its own)."""
        try:
            tiles = self._module.gpu_memory(_index(device), 1)
        except Exception:  # an older torch-directml without gpu_memory, or a driver refusal
            return 0
        return int(sum(tiles) * (1 << 20))

    memory_allocated = memory_reserved

    def get_device_properties(self, device: Any = None) -> SimpleNamespace:
        # torch-directml does not report an adapter's total memory: 0 means "unknown" to
        # ultralytics (its memory fraction becomes 0 instead of a division by zero).
        return SimpleNamespace(name=adapter_name(_index(device)), total_memory=0)

    def empty_cache(self) -> None:
        """DirectML frees memory itself; there is no cache to empty."""


class CudaOrdinalBackend(DirectMLBackend):
    """``torch.cuda`` as ultralytics asks it while dmlpatch maps CUDA to DirectML: ordinals."""

    def current_device(self) -> int:
        return runtime.current_device()


def _index(device: Any) -> int:
    if device is None:
        return _current_index
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return _current_index if index is None else index


def device_backend(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``get_torch_device_backend``: a :class:`DirectMLBackend` for ``privateuseone``."""
    bound = bound_arguments(wrapped, args, kwargs)
    device = bound.arguments["device"]
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda" and resolution.current().type == DEVICE_TYPE:
        # A DDP rank's validator asks get_torch_device_backend('cuda').current_device().
        return CudaOrdinalBackend(wrapped(torch.device(DEVICE_TYPE, 0)))
    if kind != DEVICE_TYPE:
        return wrapped(*args, **kwargs)
    return DirectMLBackend(wrapped(*args, **kwargs))


def autobackend_device(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``AutoBackend(device=torch.device('cuda', N))``: the target's adapter for ordinal N."""
    bound = bound_arguments(wrapped, args, kwargs)
    device = bound.arguments.get("device")
    if (
        isinstance(device, torch.device)
        and device.type == "cuda"
        and resolution.current().type == DEVICE_TYPE
    ):
        bound.arguments["device"] = torch.device(runtime.device(str(device)))
        return wrapped(*bound.args, **bound.kwargs)
    return wrapped(*args, **kwargs)


def synchronize() -> None:
    """Wait for DirectML's queue (torch-directml has no synchronize; see dmlpatch.runtime.sites)."""
    runtime.synchronize()


# -- timing --------------------------------------------------------------------------------


def time_sync(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``time_sync``: also waits for DirectML, which ultralytics never synchronises."""
    bound = bound_arguments(wrapped, args, kwargs)
    device = bound.arguments.get("device")
    if _is_directml(device) or (device is None and resolution.current().type == DEVICE_TYPE):
        synchronize()
    return wrapped(*args, **kwargs)


def profile_time(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``ops.Profile.time``: synchronise a DirectML device before reading the clock."""
    if _is_directml(getattr(instance, "device", None)):
        synchronize()
    return wrapped(*args, **kwargs)


# -- training ------------------------------------------------------------------------------


def setup_ddp(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``BaseTrainer._setup_ddp`` in a DDP rank of ``device=dml:0,1``: its adapter, and gloo.

    ultralytics makes the rank's device ``torch.device('cuda', index)``, calls
    ``torch.cuda.set_device`` and asks for NCCL. Here the rank gets its DirectML adapter, its
    CUDA ordinal becomes the current one (what ``'cuda'`` means in rewritten code and in the
    validator, which rebuilds ``torch.device('cuda', current_device())``), and gloo, which
    dmlpatch's torch.distributed fixes let carry DirectML tensors.
    """
    chosen = directml_request(getattr(instance.args, "device", None))
    if chosen is None:
        return wrapped(*args, **kwargs)
    from datetime import timedelta

    import torch.distributed as dist

    world_size = args[0] if args else kwargs.get("world_size", instance.world_size)
    instance.device = chosen
    runtime.set_device(max(int(os.environ.get("LOCAL_RANK", "0")), 0))
    backend_of = getattr(sys.modules.get(wrapped.__module__), "get_torch_device_backend", None)
    if backend_of is not None:  # ultralytics >= 8.2 keeps the device module as the accelerator
        instance.accelerator = backend_of(chosen)
    dist.init_process_group(
        backend="gloo",
        timeout=timedelta(seconds=10800),  # ultralytics' own: 3 hours
        rank=int(os.environ.get("RANK", "0")),
        world_size=world_size,
    )
    return None


def inference_mode_decorator(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``smart_inference_mode``: methods it decorates run under
    ``dmlpatch.runtime.inference.inference_mode``, torch's own off DirectML and ``no_grad``
    on it, decided at each call (the decorators are applied when ultralytics is imported)."""
    decorate = wrapped(*args, **kwargs)
    # 8.1 takes no argument; 8.2+ take mode (False: gradients on, already fine on DirectML).
    if not bound_arguments(wrapped, args, kwargs).arguments.get("mode", True):
        return decorate

    def decorate_per_call(function: Callable[..., Any]) -> Callable[..., Any]:
        if torch.is_inference_mode_enabled():
            return decorate(function)  # ultralytics' pass-through
        return inference.inference_mode(True)(function)

    return decorate_per_call


def fuse_on_host(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``RepConv.fuse_convs``: on DirectML, the module is fused on the CPU and moved back.

    It builds the fused ``nn.Conv2d`` on the CPU and gives it the branches' kernel through
    ``.data``, which PyTorch refuses across the CPU and a PrivateUse1 device. Moving the module
    (a copy of its few tensors, once per fusion) keeps the arithmetic exactly ultralytics'.
    """
    parameter = next(iter(instance.parameters()), None)
    if parameter is None or parameter.device.type != DEVICE_TYPE:
        return wrapped(*args, **kwargs)
    device = parameter.device
    instance.to("cpu")
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.to(device)


#: Why a DirectML run has no AMP: dmlpatch's autocast kernels are not installed.
NO_AUTOCAST = "dmlpatch's autocast kernels for DirectML are not installed"


def amp_check(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``check_amp``: ultralytics' own check where autocast runs on DirectML (it compares
    float32 with float16 autocast on the device, and training is AMP when it passes); without
    the autocast kernels, where a region would change nothing and the check would compare
    float32 with itself, False with one warning, before any download."""
    from dmlpatch.opfix import installer

    if installer.fix_installed("precision.autocast"):
        return wrapped(*args, **kwargs)
    return amp_checks_skipped(
        wrapped, args, kwargs, "training in float32 as with 'amp=False'.", NO_AUTOCAST
    )


def amp_checks_skipped(
    wrapped: Wrapper,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    training: str,
    reason: str = "DirectML has no automatic mixed precision (AMP)",
) -> Any:
    """``check_amp(model)`` of ultralytics or of yolov5 (its ancestor: same signature, same
    ``LOGGER`` and ``colorstr``): False where the model is on DirectML, with one warning in the
    library's own style giving ``reason`` and ending in ``training``; the library's own check
    anywhere else."""
    bound = bound_arguments(wrapped, args, kwargs)
    parameter = next(iter(bound.arguments["model"].parameters()), None)
    if parameter is None or parameter.device.type != DEVICE_TYPE:
        return wrapped(*args, **kwargs)
    namespace = wrapped.__globals__
    prefix = namespace["colorstr"]("AMP: ") if "colorstr" in namespace else "AMP: "
    namespace["LOGGER"].warning(f"{prefix}checks skipped ⚠️, {reason}; {training}")
    return False


def autobatch_default(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``autobatch`` (``batch=-1``): the default batch size on DirectML, as on the CPU."""
    bound = bound_arguments(wrapped, args, kwargs)
    parameter = next(iter(bound.arguments["model"].parameters()), None)
    if parameter is None or parameter.device.type != DEVICE_TYPE:
        return wrapped(*args, **kwargs)
    batch_size = bound.arguments["batch_size"]
    namespace = wrapped.__globals__
    prefix = namespace["colorstr"]("AutoBatch: ") if "colorstr" in namespace else "AutoBatch: "
    namespace["LOGGER"].warning(
        f"{prefix}torch-directml does not report total GPU memory, "
        f"using default batch-size {batch_size}"
    )
    return batch_size


def no_pinned_memory(
    wrapped: Wrapper, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``build_dataloader``: no pinned host memory for a DirectML consumer.

    Pinned memory is a CUDA (or accelerator-hooks) allocation; DirectML copies from pageable
    memory, and asking for pinning only warns or goes through a backend that cannot pin.
    """
    bound = bound_arguments(wrapped, args, kwargs)
    if _is_directml(bound.arguments.get("device")) and bound.arguments.get("pin_memory"):
        bound.arguments["pin_memory"] = False
        return wrapped(*bound.args, **bound.kwargs)
    return wrapped(*args, **kwargs)
