"""Autocast on the DirectML device, with CUDA's semantics.

torch-directml registers no kernel for the ``AutocastPrivateUse1`` dispatch key, so inside
``torch.autocast("privateuseone")`` every operator runs in the dtype it is given: the region
switches on and nothing changes. This fix registers, for each operator CUDA's autocast serves on
the running torch, a kernel on that key that casts as CUDA's does (:mod:`.autocast_policy`):
to float16 (the region's dtype), to float32, float32 results for reductions, or the widest
input; ``binary_cross_entropy`` is refused with CUDA's text. Only floating tensors on a
DirectML device are cast (float64 never), and float32 weights cast to float16 are cached
until the outermost region ends, as CUDA caches them.

Outside a region the key is excluded from dispatch, so no kernel here runs and no call pays
anything; inside one, each listed call pays one Python call (the casts are the kernels the
program asked for).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

import torch

from dmlpatch.opfix._kernel import Kernel
from dmlpatch.opfix.precision import autocast_policy

NO_CHOICE = (
    "autocast's casts are the kernels the program asked for on the device; a CPU round trip "
    "would add copies to the same casts"
)

#: The dispatch key the kernels serve.
KEY = "AutocastPrivateUse1"

_DEVICE_TYPE = "privateuseone"
_calls_lock = threading.Lock()
#: Operator calls the kernels served, by the dtype they ran them in (``dmlpatch check``).
_calls: dict[str, int] = {}
_below_autocast = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_cache_lock = threading.Lock()
#: float16 casts of float32 leaf weights, by the weight's id: (a weak reference to the weight,
#: its cast). Emptied when the outermost autocast region ends (:func:`clear_cache`).
_cache: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype is not torch.float64
        and value.device.type == _DEVICE_TYPE
    )


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """``value`` in ``dtype`` where it is a tensor autocast casts; lists element by element."""
    if isinstance(value, torch.Tensor):
        if value.dtype is dtype or not _eligible(value):
            return value
        if (
            value.dtype is torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
            and dtype is torch.get_autocast_dtype(_DEVICE_TYPE)
            and torch.is_autocast_cache_enabled()
        ):
            return _cached(value, dtype)
        return value.to(dtype)
    if isinstance(value, (list, tuple)) and value and _holds_tensors(value):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _holds_tensors(values: Any) -> bool:
    return any(isinstance(item, torch.Tensor) for item in values)


def _cached(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not _clearing:
        _clear_with_torch()
    key = id(weight)
    with _cache_lock:
        found = _cache.get(key)
        if found is not None and found[0]() is weight:
            return found[1]
    cast = weight.to(dtype)
    with _cache_lock:
        _cache[key] = (weakref.ref(weight), cast)
    return cast


def _count(dtype: torch.dtype) -> None:
    name = str(dtype).replace("torch.", "")
    with _calls_lock:
        _calls[name] = _calls.get(name, 0) + 1


def calls() -> dict[str, int]:
    """Operator calls autocast served on the device so far, by the dtype it ran them in."""
    with _calls_lock:
        return dict(_calls)


def clear_cache() -> None:
    """Drop the cached casts (torch calls this when the outermost autocast region ends)."""
    with _cache_lock:
        _cache.clear()


#: torch's ``clear_autocast_cache`` while dmlpatch's wraps it.
_clearing: list[Callable[[], None]] = []
_LEDGER_KEY = f"{__name__}:clear_autocast_cache"


def _clear_with_torch() -> None:
    """Have ``torch.clear_autocast_cache`` (which ``torch.autocast`` calls as the outermost
    region ends) drop these casts too, as it drops CUDA's: from the first cast cached on."""
    from dmlpatch import changes

    torch_clear = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        torch_clear()
        clear_cache()

    _clearing.append(torch_clear)
    changes.replace(
        torch,
        "clear_autocast_cache",
        clear_autocast_cache,
        _LEDGER_KEY,
        "torch.clear_autocast_cache (also drops the float16 weights DirectML's autocast cached)",
    )


def _lower(op: Callable[..., Any]) -> Callable[..., Any]:
    def lower_precision(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype(_DEVICE_TYPE)
        _count(dtype)
        with torch._C._ExcludeDispatchKeyGuard(_below_autocast):
            return op(
                *[_cast(value, dtype) for value in args],
                **{name: _cast(value, dtype) for name, value in kwargs.items()},
            )

    return lower_precision


def _float32(op: Callable[..., Any]) -> Callable[..., Any]:
    def in_float32(*args: Any, **kwargs: Any) -> Any:
        _count(torch.float32)
        with torch._C._ExcludeDispatchKeyGuard(_below_autocast):
            return op(
                *[_cast(value, torch.float32) for value in args],
                **{name: _cast(value, torch.float32) for name, value in kwargs.items()},
            )

    return in_float32


def _float32_output(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """A reduction given no dtype answers in float32; its input is not cast."""
    names = [argument.name for argument in op._schema.arguments]
    position = names.index("dtype")

    def float32_output(*args: Any, **kwargs: Any) -> Any:
        if args and _eligible(args[0]):
            _count(torch.float32)
            if position < len(args):
                if args[position] is None:
                    args = (*args[:position], torch.float32, *args[position + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        with torch._C._ExcludeDispatchKeyGuard(_below_autocast):
            return op(*args, **kwargs)

    return float32_output


def _float32_overload(with_dtype: torch._ops.OpOverload) -> Callable[..., Any]:
    """``norm`` without a dtype, answered by its overload with one: float32 for a tensor
    autocast casts, the tensor's own dtype otherwise."""

    def float32_by_overload(first: Any, *args: Any, **kwargs: Any) -> Any:
        dtype = torch.float32 if _eligible(first) else first.dtype
        _count(dtype)
        with torch._C._ExcludeDispatchKeyGuard(_below_autocast):
            return with_dtype(first, *args, **kwargs, dtype=dtype)

    return float32_by_overload


def _widest_type(values: Any) -> torch.dtype:
    widest = torch.get_autocast_dtype(_DEVICE_TYPE)
    for value in values:
        if isinstance(value, (list, tuple)):
            widest = _widest_of(widest, _widest_type(value))
        elif _eligible(value):
            widest = _widest_of(widest, value.dtype)
    return widest


def _widest_of(current: torch.dtype, other: torch.dtype) -> torch.dtype:
    if current is torch.float32 or other is torch.float32:
        return torch.float32
    if current is other:
        return current
    # float16 with bfloat16: CUDA refuses the mix; so does torch's own promotion below.
    return torch.promote_types(current, other)


def _widest(op: Callable[..., Any]) -> Callable[..., Any]:
    def to_widest(*args: Any, **kwargs: Any) -> Any:
        dtype = _widest_type((*args, *kwargs.values()))
        _count(dtype)
        with torch._C._ExcludeDispatchKeyGuard(_below_autocast):
            return op(
                *[_cast(value, dtype) for value in args],
                **{name: _cast(value, dtype) for name, value in kwargs.items()},
            )

    return to_widest


def _library_float32(namespace: str, name: str, as_input: bool) -> Callable[..., Any]:
    """A library's operator (torchvision's RoI operators) in float32, its results cast back to
    its first input's dtype where ``as_input``; the operator is looked up at the call, since the
    library registers it only when imported."""

    def library_float32(*args: Any, **kwargs: Any) -> Any:
        op = getattr(getattr(torch.ops, namespace), name).default
        _count(torch.float32)
        with torch._C._ExcludeDispatchKeyGuard(_below_autocast):
            result = op(
                *[_cast(value, torch.float32) for value in args],
                **{key: _cast(value, torch.float32) for key, value in kwargs.items()},
            )
        if not as_input:
            return result
        dtype = args[0].dtype
        if isinstance(result, tuple):
            return tuple(item.to(dtype) for item in result)
        return result.to(dtype)

    return library_float32


def _banned(text: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(text)

    return refused


def _overload(name: str) -> Optional[torch._ops.OpOverload]:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _kernel(name: str, policy: str) -> Optional[Kernel]:
    op = _overload(name)
    if op is None:
        return None
    if policy == "lower":
        function = _lower(op)
    elif policy == "float32":
        function = _float32(op)
    elif policy == "float32-output":
        function = _float32_output(op)
    elif policy == "float32-overload":
        with_dtype = _overload(autocast_policy.FLOAT32_BY_DTYPE_OVERLOAD[name])
        if with_dtype is None:
            return None
        function = _float32_overload(with_dtype)
    elif policy == "widest":
        function = _widest(op)
    else:
        function = _banned(autocast_policy.BANNED[name])
    return Kernel(name, function, "autocast", key=KEY)


def _kernels() -> tuple[Kernel, ...]:
    served = autocast_policy.cuda_registered()
    made = (
        _kernel(name, policy)
        for name, policy in sorted(autocast_policy.policies().items())
        if name in served
    )
    kernels = [kernel for kernel in made if kernel is not None]
    for names, as_input in (
        (autocast_policy.TORCHVISION_FLOAT32_AS_INPUT, True),
        (autocast_policy.TORCHVISION_FLOAT32, False),
    ):
        for name in names:
            function = _library_float32("torchvision", name, as_input)
            kernels.append(Kernel(name, function, "autocast", key=KEY, namespace="torchvision"))
    return tuple(kernels)


KERNELS = _kernels()


def served(namespace: str = "aten") -> frozenset[str]:
    """The overloads autocast casts on the device (``torch.library`` names) of one operator
    library."""
    return frozenset(kernel.name for kernel in KERNELS if kernel.namespace == namespace)


def reset() -> None:
    """Drop the cache and give torch its own ``clear_autocast_cache`` back."""
    from dmlpatch import changes

    clear_cache()
    with _calls_lock:
        _calls.clear()
    if _clearing:
        torch.clear_autocast_cache = _clearing.pop()
        changes.forget(_LEDGER_KEY)
