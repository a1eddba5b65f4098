"""``torch.autocast('cuda')`` and ``GradScaler`` in rewritten code: mixed precision on DirectML.

The rewriter passes the callee it replaced (``torch.autocast``, ``torch.amp.autocast``,
``torch.cuda.amp.autocast``, ``torch.amp.GradScaler``, ``torch.cuda.amp.GradScaler`` or the
same names imported). Where the call would target DirectML (``"cuda"``, ``"privateuseone"``,
``"dml"``), the program gets the same thing for the DirectML device: an autocast region there,
whose operators cast as CUDA's do (:mod:`dmlpatch.opfix.precision.autocast`), and a GradScaler
on the device. Any other device type, and any run on a CUDA GPU or on the CPU, calls the
callee exactly as written.

Precision: float16, CUDA's default. DirectML has no bfloat16 arithmetic, and float16 in place of
bfloat16 would need the loss scaling a bfloat16 program does not do, so a bfloat16 region runs
without autocast (float32), said once, unless ``DMLPATCH_BF16=float16`` asks for float16
(as it does for bfloat16 tensors). Where the autocast kernels could not be installed, autocast
and GradScaler are off and the run is float32, said once.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, NamedTuple, Optional

from dmlpatch import log
from dmlpatch.devices import resolution as _resolution
from dmlpatch.environment_variables import DMLPATCH_BF16
from dmlpatch.runtime import on_behalf

#: Device types that name DirectML in an autocast or GradScaler call, beside the backend's own.
_DIRECTML_NAMES = ("cuda", "dml")


class _Autocast(NamedTuple):
    device_type: Any
    dtype: Any
    enabled: bool
    cache_enabled: Optional[bool]


class _Scaler(NamedTuple):
    device: Any
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    enabled: bool


def autocast(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``original(*args, **kwargs)``, or the same region on the DirectML device."""
    options = _autocast_options(original, args, kwargs)
    target = _directml_target(options.device_type)
    if target is None:
        return on_behalf.call(original, args, kwargs, depth=3)  # past sites.py
    import torch

    if not _kernels_installed():
        if options.enabled:
            _say_float32(target)
        return _Float32()
    dtype = _dtype_on_directml(options.dtype, options.enabled)
    if dtype is None:
        return torch.autocast(target.type, enabled=False)
    if options.enabled:
        log.say_once(
            "amp",
            f"mixed precision: autocast computes in float16 on {target.device} with CUDA's "
            "operator lists",
        )
    if _spelled_cuda(options.device_type):
        return _cuda_spelled_class()(
            target.type, dtype=dtype, enabled=options.enabled, cache_enabled=options.cache_enabled
        )
    return torch.autocast(
        target.type, dtype=dtype, enabled=options.enabled, cache_enabled=options.cache_enabled
    )


def grad_scaler(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``original(*args, **kwargs)``, or the same GradScaler for the DirectML device."""
    options = _scaler_options(original, args, kwargs)
    target = _directml_target(options.device)
    if target is None:
        return on_behalf.call(original, args, kwargs, depth=3)  # past sites.py
    import torch

    if not _kernels_installed():
        # A disabled GradScaler is the identity: the AMP loop runs unchanged in float32.
        if options.enabled:
            _say_float32(target)
        return torch.amp.GradScaler("cuda", enabled=False)
    return torch.amp.GradScaler(
        target.type,
        init_scale=options.init_scale,
        growth_factor=options.growth_factor,
        backoff_factor=options.backoff_factor,
        growth_interval=options.growth_interval,
        enabled=options.enabled,
    )


def custom_amp(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.amp.custom_fwd`` / ``custom_bwd``, or where CUDA means DirectML, torch.amp's
    decorators for the device.

    CUDA's read and set CUDA's autocast state, which the device's operators do not read: a
    forward declared with ``cast_inputs=torch.float32`` would get the region's float16 inputs
    and compute in float16, and a backward would run without the forward's autocast, where
    float16 gradients meeting float32 weights fail. Inside the device's, CUDA's flags read as
    the device's, as they do in a region the program wrote for CUDA.
    """
    target = _directml_target("cuda")
    name = getattr(original, "__name__", None)
    if target is None or name not in ("custom_fwd", "custom_bwd"):
        return original
    device_type = target.type
    import torch

    if name == "custom_bwd":

        def custom_bwd(bwd: Callable[..., Any]) -> Callable[..., Any]:
            return torch.amp.custom_bwd(_cuda_flags_as(device_type, bwd), device_type=device_type)

        return custom_bwd

    def custom_fwd(fwd: Optional[Callable[..., Any]] = None, *, cast_inputs: Any = None) -> Any:
        if fwd is None:
            return functools.partial(custom_fwd, cast_inputs=cast_inputs)
        return torch.amp.custom_fwd(
            _cuda_flags_as(device_type, fwd), device_type=device_type, cast_inputs=cast_inputs
        )

    return custom_fwd


def _cuda_flags_as(device_type: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with CUDA's autocast flags set to the device's while it runs."""
    import torch

    @functools.wraps(function)
    def as_on_cuda(*args: Any, **kwargs: Any) -> Any:
        before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        enabled = torch.is_autocast_enabled(device_type)
        torch.set_autocast_enabled("cuda", enabled)
        if enabled:
            torch.set_autocast_dtype("cuda", torch.get_autocast_dtype(device_type))
        try:
            return function(*args, **kwargs)
        finally:
            torch.set_autocast_enabled("cuda", before[0])
            torch.set_autocast_dtype("cuda", before[1])

    return as_on_cuda


def say_off() -> None:
    """The line a program's mixed precision gets where DirectML runs it in float32 (once)."""
    _say_float32(_resolution.current())


def off_on_directml(device_type: Any) -> bool:
    """Whether autocast for ``device_type`` is off here because it would target DirectML and
    the autocast kernels are not installed (the run is float32): for libraries that prepare
    their inputs for autocast themselves."""
    return _directml_target(device_type) is not None and not _kernels_installed()


def on_directml(device_type: Any) -> bool:
    """Whether autocast for ``device_type`` runs on DirectML, with its kernels installed."""
    return _directml_target(device_type) is not None and _kernels_installed()


class _Float32:
    """What autocast is where there is no AMP: a context (or decorator) that changes nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def float32(*args: Any, **kwargs: Any) -> Any:
            with self:
                return function(*args, **kwargs)

        return float32


_cuda_spelled: Any = None


def _cuda_spelled_class() -> Any:
    """``torch.autocast`` on the DirectML device for a region the program wrote for CUDA: inside
    it CUDA's autocast also reads as on (``torch.is_autocast_enabled()``, whose default device is
    CUDA, ``torch.get_autocast_gpu_dtype()``), as the program expects; only CUDA tensors read
    those flags, and this process has none."""
    global _cuda_spelled
    if _cuda_spelled is None:
        import torch

        class autocast(torch.autocast):
            def __enter__(self) -> None:
                self._cuda_before = (
                    torch.is_autocast_enabled("cuda"),
                    torch.get_autocast_dtype("cuda"),
                )
                torch.set_autocast_enabled("cuda", self._enabled)
                torch.set_autocast_dtype("cuda", self.fast_dtype)
                super().__enter__()

            def __exit__(self, *exc: Any) -> Any:
                try:
                    return super().__exit__(*exc)
                finally:
                    torch.set_autocast_enabled("cuda", self._cuda_before[0])
                    torch.set_autocast_dtype("cuda", self._cuda_before[1])

        autocast.__module__ = torch.autocast.__module__
        _cuda_spelled = autocast
    return _cuda_spelled


def _spelled_cuda(device_type: Any) -> bool:
    return str(getattr(device_type, "type", device_type)).split(":")[0] == "cuda"


def _argument(args: Any, kwargs: Any, name: str, position: int, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[position] if len(args) > position else default


def _cuda_amp(original: Any) -> bool:
    """``torch.cuda.amp.autocast`` / ``GradScaler``: CUDA by name, with positional options."""
    return str(getattr(original, "__module__", "")).startswith("torch.cuda.amp")


def _autocast_options(original: Any, args: Any, kwargs: Any) -> _Autocast:
    if _cuda_amp(original):  # (enabled=True, dtype=torch.float16, cache_enabled=True)
        return _Autocast(
            "cuda",
            _argument(args, kwargs, "dtype", 1, None),
            bool(_argument(args, kwargs, "enabled", 0, True)),
            _argument(args, kwargs, "cache_enabled", 2, None),
        )
    # (device_type, dtype=None, enabled=True, cache_enabled=None)
    return _Autocast(
        _argument(args, kwargs, "device_type", 0, None),
        _argument(args, kwargs, "dtype", 1, None),
        bool(_argument(args, kwargs, "enabled", 2, True)),
        _argument(args, kwargs, "cache_enabled", 3, None),
    )


def _scaler_options(original: Any, args: Any, kwargs: Any) -> _Scaler:
    # torch.cuda.amp.GradScaler has no device argument; torch.amp.GradScaler's comes first.
    offset, device = (0, "cuda") if _cuda_amp(original) else (1, None)
    if device is None:
        device = _argument(args, kwargs, "device", 0, "cuda")
    return _Scaler(
        device,
        _argument(args, kwargs, "init_scale", offset, 2.0**16),
        _argument(args, kwargs, "growth_factor", offset + 1, 2.0),
        _argument(args, kwargs, "backoff_factor", offset + 2, 0.5),
        _argument(args, kwargs, "growth_interval", offset + 3, 2000),
        bool(_argument(args, kwargs, "enabled", offset + 4, True)),
    )


def _dtype_on_directml(asked: Any, enabled: bool) -> Any:
    """The autocast dtype a region asking for ``asked`` gets on DirectML: float16, or None for
    a region without autocast (bfloat16 by default, and dtypes DirectML's autocast lacks)."""
    import torch

    if asked is None:
        asked = torch.get_autocast_dtype("cuda")  # CUDA's default for the region, float16
    if asked is torch.float16:
        return asked
    if asked is torch.bfloat16:
        from dmlpatch.gaps.bf16_setting import parse_bf16

        if parse_bf16(os.environ.get(DMLPATCH_BF16)) == "float16":
            if enabled:
                log.say_once(
                    "amp:bf16",
                    "bfloat16 autocast computes in float16 on DirectML "
                    f"({DMLPATCH_BF16}=float16): float16's range, and no loss scaling unless "
                    "the program uses a GradScaler",
                )
            return torch.float16
        if enabled:
            log.say_once(
                "amp:bf16",
                "DirectML has no bfloat16 arithmetic: the program's bfloat16 autocast runs in "
                f"float32 ({DMLPATCH_BF16}=float16 runs it in float16)",
            )
        return None
    if enabled and asked is not torch.float32:
        log.warn_once(
            f"amp:{asked}",
            f"autocast to {asked}: DirectML's autocast computes in float16 only; the region "
            "runs without autocast",
        )
    return None


def _kernels_installed() -> bool:
    # Read, not imported: the fixes import the rewriter, which imports this module's callers.
    installer = sys.modules.get("dmlpatch.opfix.installer")
    return installer is not None and bool(installer.fix_installed("precision.autocast"))


def _directml_target(device_type: Any) -> Optional[_resolution.Resolution]:
    resolution = _resolution.current()
    if not (resolution.patches_needed and resolution.is_accelerator):
        return None
    # A rewritten program's device string carries an index ('privateuseone:0').
    kind = str(getattr(device_type, "type", device_type)).split(":")[0]
    if kind in _DIRECTML_NAMES or kind == resolution.type:
        return resolution
    return None


def _say_float32(target: _resolution.Resolution) -> None:
    log.warn_once(
        "amp",
        "DirectML's autocast kernels are not installed: the program's autocast and GradScaler "
        f"are off and it runs in float32 on {target.device}",
    )
