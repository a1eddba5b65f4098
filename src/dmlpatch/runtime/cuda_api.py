"""``torch.cuda.<name>`` in rewritten code, for the CUDA API a program calls once it has a device.

The rewriter routes ``torch.cuda.X`` for each X in :data:`NAMES` to ``__dmlpatch__.torch_cuda.X``
(this module), and ``from torch.cuda import X`` to an import from here. On a usable CUDA GPU, and
where the program runs on the CPU, each name is torch.cuda's own, failing as it fails there. On
DirectML (or the simulated device) each answers for the adapter the program's ordinal maps to:

- ``get_device_properties``: the adapter's name and memory, compute capability 0.0 (no CUDA
  fast path applies: DirectML has no TF32, bfloat16 or flash-attention kernels) and one
  multiprocessor (DirectML does not say how many it has);
- memory: what torch-directml's allocator reports holding (``gpu_memory``); peaks are the
  highest value read since the last reset, as DirectML keeps none itself; ``mem_get_info``
  is free and total memory where the adapter's size is known (Windows), else CUDA's error;
- ``Stream`` / ``Event``: DirectML runs one queue per adapter, so a stream is that queue and an
  event records the time after draining it (``elapsed_time`` in milliseconds, as CUDA's);
- ``torch.cuda.device(i)``: ordinal i is current inside, as with ``set_device``;
- ``FloatTensor`` and the other legacy types: built on the device; ``isinstance`` checks dtype
  and device; ``x.type(torch.cuda.FloatTensor)`` moves ``x`` (``retype``).

Nothing here imports torch until a name is used.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, NamedTuple, Optional

from dmlpatch import log
from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime import cuda_device as _cuda_device

#: torch.cuda's legacy tensor types and their dtypes.
_LEGACY_TYPES = {
    "FloatTensor": "float32",
    "DoubleTensor": "float64",
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "ByteTensor": "uint8",
    "CharTensor": "int8",
    "ShortTensor": "int16",
    "IntTensor": "int32",
    "LongTensor": "int64",
    "BoolTensor": "bool",
}
LEGACY_TYPE_NAMES = frozenset(_LEGACY_TYPES)

_MEMORY_FUNCTIONS = (
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_accumulated_memory_stats",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "memory_snapshot",
    "mem_get_info",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
    "ipc_collect",
)

_RNG_FUNCTIONS = (
    "get_rng_state",
    "get_rng_state_all",
    "set_rng_state",
    "set_rng_state_all",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "default_generators",
)

#: Names that raise a clear error on DirectML when used: CUDA graphs capture CUDA kernels to
#: replay them, and nothing on DirectML replays a capture.
ERRORS = frozenset({"CUDAGraph", "graph", "graph_pool_handle"})

#: The ``torch.cuda`` names answered here (those in :data:`ERRORS` with an error).
NAMES = frozenset(
    {
        "get_device_properties",
        "get_device_capability",
        "is_bf16_supported",
        "is_tf32_supported",
        "init",
        "can_device_access_peer",
        "device",
        "device_of",
        "Stream",
        "Event",
        "stream",
        "StreamContext",
        "set_stream",
        "current_stream",
        "default_stream",
        "is_current_stream_capturing",
        "make_graphed_callables",
        "nvtx",
        "random",
        *_MEMORY_FUNCTIONS,
        *_RNG_FUNCTIONS,
        *_LEGACY_TYPES,
        *ERRORS,
    }
)

_LEGACY_TYPE_TEXT = re.compile(r"torch\.cuda\.(\w+Tensor)")


def _target() -> Optional[_resolution.Resolution]:
    """The resolution when programs are redirected to an accelerator; None where torch.cuda's
    own answer is the right one (a CUDA GPU, or the CPU, where it fails as it would anyway)."""
    resolution = _resolution.current()
    if resolution.patches_needed and resolution.is_accelerator:
        return resolution
    return None


def _cuda(name: str) -> Any:
    import torch

    return getattr(torch.cuda, name)


def _adapter(device: Any) -> int:
    """The adapter index behind a program's device argument (an ordinal, ``'cuda:1'``, a
    ``torch.device``, or the target's own ``privateuseone:N``)."""
    target = _resolution.current()
    if getattr(device, "type", None) == target.type and device.index is not None:
        return int(device.index)
    if isinstance(device, str) and device.startswith(f"{target.type}:"):
        return int(device.partition(":")[2])
    return _cuda_device.target_index(_cuda_device.ordinal_of(device))


# -- properties ---------------------------------------------------------------------------------


class DeviceProperties(NamedTuple):
    """What ``torch.cuda.get_device_properties`` returns, for a DirectML adapter."""

    name: str
    total_memory: int
    major: int = 0
    minor: int = 0
    multi_processor_count: int = 1
    is_integrated: int = 0
    is_multi_gpu_board: int = 0

    def __repr__(self) -> str:
        return (
            f"_DirectMLDeviceProperties(name='{self.name}', major={self.major}, "
            f"minor={self.minor}, total_memory={self.total_memory // 2**20}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device: Any = None) -> Any:
    target = _target()
    if target is None:
        return _cuda("get_device_properties")(device)
    index = _adapter(device)
    name = target.adapter_name(index)
    return DeviceProperties(name, _total_memory(target, name), is_integrated=int(_integrated(name)))


def get_device_capability(device: Any = None) -> tuple[int, int]:
    if _target() is None:
        return tuple(_cuda("get_device_capability")(device))
    properties = get_device_properties(device)
    return properties.major, properties.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: bfloat16 kernels abort DirectML (microsoft/DirectML#688)."""
    if _target() is None:
        return bool(_cuda("is_bf16_supported")())
    return False


def is_tf32_supported() -> bool:
    """False: DirectML has no TF32 kernels."""
    if _target() is None:
        return bool(_cuda("is_tf32_supported")())
    return False


def init() -> None:
    """Nothing to start: the device is already resolved."""
    if _target() is None:
        _cuda("init")()


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """False: a DirectML adapter reads another's memory only through the host."""
    if _target() is None:
        return bool(_cuda("can_device_access_peer")(device, peer_device))
    _adapter(device)
    _adapter(peer_device)
    return False


def _total_memory(target: _resolution.Resolution, name: str) -> int:
    from dmlpatch.devices import adapters

    size = adapters.total_memory(target.backend, name)
    if size is None:
        log.warn_once(
            f"memory:{name}",
            f"the memory size of {name} is unknown on this system (DirectML does not report "
            "it); torch.cuda.get_device_properties(...).total_memory reads 0",
        )
        return 0
    return size


def _integrated(name: str) -> bool:
    return "integrated" in name.lower() or any(
        word in name for word in ("UHD", "Iris", "Radeon(TM) Graphics", "Vega 8")
    )


# -- memory -------------------------------------------------------------------------------------

#: The highest allocator figure read per adapter since the last reset.
_peaks: dict[int, int] = {}


def _in_use(device: Any) -> int:
    from dmlpatch.devices import adapters

    target = _resolution.current()
    index = _adapter(device)
    used = adapters.memory_in_use(target.backend, index)
    _peaks[index] = max(_peaks.get(index, 0), used)
    return used


def _memory_function(name: str, answer: Callable[[Any], Any]) -> Callable[..., Any]:
    def function(device: Any = None) -> Any:
        if _target() is None:
            return _cuda(name)(device)
        return answer(device)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"``torch.cuda.{name}`` for the DirectML adapter ``device`` maps to."
    return function


def _peak(device: Any) -> int:
    _in_use(device)
    return _peaks[_adapter(device)]


def _reset_peak(device: Any) -> None:
    _peaks.pop(_adapter(device), None)
    _in_use(device)


def _stats(device: Any) -> dict[str, int]:
    current, peak = _in_use(device), _peak(device)
    stats: dict[str, int] = {}
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[f"{kind}.all.current"] = current
        stats[f"{kind}.all.peak"] = peak
    return stats


def _summary(device: Any = None, abbreviated: bool = False) -> str:
    current, peak = _in_use(device), _peak(device)
    name = _resolution.current().adapter_name(_adapter(device))
    return (
        f"DirectML memory of {name}: {current / 2**20:.1f} MiB in use, "
        f"{peak / 2**20:.1f} MiB peak (torch-directml's allocator; no per-pool statistics)"
    )


def _free_and_total(device: Any) -> tuple[int, int]:
    target = _resolution.current()
    name = target.adapter_name(_adapter(device))
    from dmlpatch.devices import adapters

    total = adapters.total_memory(target.backend, name)
    if total is None:
        raise RuntimeError(
            f"torch.cuda.mem_get_info: the memory size of {name} is unknown on this system "
            "(DirectML does not report it)"
        )
    return max(total - _in_use(device), 0), total


def _nested_stats(device: Any) -> dict[str, Any]:
    """``memory_stats_as_nested_dict``: the flat statistics' dotted keys as nested dicts."""
    nested: dict[str, Any] = {}
    for key, value in _stats(device).items():
        *path, last = key.split(".")
        level = nested
        for part in path:
            level = level.setdefault(part, {})
        level[last] = value
    return nested


memory_allocated = _memory_function("memory_allocated", _in_use)
memory_reserved = _memory_function("memory_reserved", _in_use)
memory_cached = _memory_function("memory_cached", _in_use)
max_memory_allocated = _memory_function("max_memory_allocated", _peak)
max_memory_reserved = _memory_function("max_memory_reserved", _peak)
max_memory_cached = _memory_function("max_memory_cached", _peak)
reset_peak_memory_stats = _memory_function("reset_peak_memory_stats", _reset_peak)
reset_max_memory_allocated = _memory_function("reset_max_memory_allocated", _reset_peak)
reset_max_memory_cached = _memory_function("reset_max_memory_cached", _reset_peak)
reset_accumulated_memory_stats = _memory_function(
    "reset_accumulated_memory_stats", lambda device: _reset_peak(device)
)
memory_stats = _memory_function("memory_stats", _stats)
memory_stats_as_nested_dict = _memory_function("memory_stats_as_nested_dict", _nested_stats)
mem_get_info = _memory_function("mem_get_info", _free_and_total)
get_per_process_memory_fraction = _memory_function(
    "get_per_process_memory_fraction", lambda device: 1.0
)


def memory_snapshot(*args: Any, **kwargs: Any) -> list[Any]:
    """No segments: torch-directml's allocator does not list them."""
    if _target() is None:
        return list(_cuda("memory_snapshot")(*args, **kwargs))
    return []


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    if _target() is None:
        return str(_cuda("memory_summary")(device, abbreviated))
    return _summary(device, abbreviated)


def ipc_collect() -> None:
    """Nothing to collect: DirectML tensors are not shared between processes."""
    if _target() is None:
        _cuda("ipc_collect")()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    if _target() is None:
        _cuda("set_per_process_memory_fraction")(fraction, device)
        return
    log.warn_once(
        "memory_fraction",
        "torch.cuda.set_per_process_memory_fraction has no DirectML counterpart; "
        "the program's memory is not capped",
    )


# -- the current device -------------------------------------------------------------------------


class device:
    """``with torch.cuda.device(i):`` makes ordinal i current, then restores the previous one."""

    def __new__(cls, device: Any) -> Any:
        if _target() is None:
            return _cuda("device")(device)
        return super().__new__(cls)

    def __init__(self, device: Any) -> None:
        self.ordinal = _cuda_device.ordinal_of(device)
        self.previous: Optional[int] = None

    def __enter__(self) -> None:
        self.previous = _cuda_device.current_device()
        if self.ordinal is not None and self.ordinal >= 0:
            _cuda_device.set_device(self.ordinal)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            _cuda_device.set_device(self.previous)


def device_of(obj: Any) -> Any:
    """``with torch.cuda.device_of(tensor):``: the ordinal of the adapter ``tensor`` is on is
    current inside; a tensor elsewhere changes nothing, as on CUDA."""
    if _target() is None:
        return _cuda("device_of")(obj)
    target = _resolution.current()
    on: Any = getattr(obj, "device", None)
    ordinal = -1
    if getattr(on, "type", None) == target.type and on.index in target.indices:
        ordinal = target.indices.index(on.index)
    return device(ordinal)


# -- random numbers -------------------------------------------------------------------------------


def _generator() -> Any:
    """The generator the DirectML device draws from: the CPU's default generator (so do
    torch-directml's kernels, and the simulated device's)."""
    import torch

    return torch.default_generator


def get_rng_state(device: Any = "cuda") -> Any:
    if _target() is None:
        return _cuda("get_rng_state")(device)
    _adapter(device)
    return _generator().get_state()


def get_rng_state_all() -> list[Any]:
    if _target() is None:
        return list(_cuda("get_rng_state_all")())
    return [_generator().get_state() for _ in _resolution.current().indices]


def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
    if _target() is None:
        _cuda("set_rng_state")(new_state, device)
        return
    _adapter(device)
    generator = _generator()
    expected = generator.get_state().numel()
    if new_state.numel() != expected:
        # A CUDA generator's state (a checkpoint written on a GPU): plain python without CUDA
        # never restores it, so neither does the device; one line says so.
        log.warn_once(
            "rng_state",
            f"torch.cuda.set_rng_state was given a CUDA generator's state ({new_state.numel()} "
            f"bytes); DirectML draws from the CPU generator ({expected} bytes), which keeps "
            "its state",
        )
        return
    generator.set_state(new_state.clone())


def set_rng_state_all(new_states: Any) -> None:
    if _target() is None:
        _cuda("set_rng_state_all")(new_states)
        return
    for ordinal, state in enumerate(new_states):
        set_rng_state(state, ordinal)


def manual_seed(seed: int) -> None:
    if _target() is None:
        _cuda("manual_seed")(seed)
        return
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    if _target() is None:
        _cuda("manual_seed_all")(seed)
        return
    _generator().manual_seed(int(seed))


def seed() -> None:
    if _target() is None:
        _cuda("seed")()
        return
    _generator().seed()


def seed_all() -> None:
    if _target() is None:
        _cuda("seed_all")()
        return
    _generator().seed()


def initial_seed() -> int:
    if _target() is None:
        return int(_cuda("initial_seed")())
    return int(_generator().initial_seed())


class _Random:
    """``torch.cuda.random``: the RNG family above, by its submodule's name."""

    get_rng_state = staticmethod(get_rng_state)
    get_rng_state_all = staticmethod(get_rng_state_all)
    set_rng_state = staticmethod(set_rng_state)
    set_rng_state_all = staticmethod(set_rng_state_all)
    manual_seed = staticmethod(manual_seed)
    manual_seed_all = staticmethod(manual_seed_all)
    seed = staticmethod(seed)
    seed_all = staticmethod(seed_all)
    initial_seed = staticmethod(initial_seed)

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda.random, name)


random = _Random()


# -- streams and events -------------------------------------------------------------------------


def _drain(adapter: int) -> None:
    """Wait until the adapter's queue has run: a device-to-host read does that on DirectML."""
    import torch

    target = _resolution.current()
    torch.zeros(1, device=f"{target.type}:{adapter}").cpu()


class Stream:
    """The adapter's one queue. Work is ordered on it already, so waiting on another stream or
    event needs nothing; ``synchronize`` drains it."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Any:
        if _target() is None:
            return _cuda("Stream")(device, priority, **kwargs)
        return super().__new__(cls)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        import torch

        self.adapter = _adapter(device)
        self.priority = priority
        self.device = torch.device(_resolution.current().type, self.adapter)

    def synchronize(self) -> None:
        _drain(self.adapter)

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Event:
        recorded = event if event is not None else Event()
        recorded.record(self)
        return recorded

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.adapter == self.adapter

    def __hash__(self) -> int:
        return hash((Stream, self.adapter))

    def __repr__(self) -> str:
        return f"<dmlpatch DirectML queue device={self.device}>"


class Event:
    """A point on the adapter's queue; ``record`` drains the queue and reads the clock."""

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Any:
        if _target() is None:
            return _cuda("Event")(enable_timing, blocking, interprocess)
        return super().__new__(cls)

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing
        self.recorded_at: Optional[float] = None

    def record(self, stream: Any = None) -> None:
        adapter = stream.adapter if isinstance(stream, Stream) else _adapter(None)
        _drain(adapter)
        self.recorded_at = time.perf_counter()

    def synchronize(self) -> None:
        return None  # record() has waited already

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.recorded_at is None or end_event.recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event.recorded_at - self.recorded_at) * 1000.0


def current_stream(device: Any = None) -> Any:
    if _target() is None:
        return _cuda("current_stream")(device)
    return Stream(device)


def default_stream(device: Any = None) -> Any:
    if _target() is None:
        return _cuda("default_stream")(device)
    return Stream(device)


class _StreamContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def stream(stream: Any) -> Any:
    """``with torch.cuda.stream(s):``: one queue, so nothing changes inside."""
    if _target() is None:
        return _cuda("stream")(stream)
    return _StreamContext()


class _TorchsOffTarget(type):
    """A class standing for torch.cuda's class of the same name: called, it is torch's off the
    DirectML target and ``on_target(...)`` on it; ``isinstance`` asks torch's class too. A class,
    not a function, so annotations (``torch.cuda.CUDAGraph | None``), ``isinstance`` and
    subclassing work wherever the name is used."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if _target() is None:
            return _cuda(cls.__name__)(*args, **kwargs)
        return cls.on_target(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        if type.__instancecheck__(cls, instance):
            return True
        own = _cuda(cls.__name__)
        return isinstance(own, type) and isinstance(instance, own)

    def on_target(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class StreamContext(metaclass=_TorchsOffTarget):
    """``torch.cuda.StreamContext(s)``: as :func:`stream`."""

    @classmethod
    def on_target(cls, stream: Any = None) -> Any:
        return _StreamContext()


def set_stream(stream: Any) -> None:
    """One queue per adapter: it is always the current stream."""
    if _target() is None:
        _cuda("set_stream")(stream)


def is_current_stream_capturing() -> bool:
    """False: nothing on DirectML captures a graph."""
    if _target() is None:
        return bool(_cuda("is_current_stream_capturing")())
    return False


# -- CUDA graphs ----------------------------------------------------------------------------------


def _no_graphs(name: str) -> RuntimeError:
    return RuntimeError(
        f"torch.cuda.{name}: CUDA graphs have no DirectML counterpart (nothing replays a "
        "captured graph there); run the program without CUDA graphs, or on a CUDA GPU"
    )


class CUDAGraph(metaclass=_TorchsOffTarget):
    """``torch.cuda.CUDAGraph()``: a clear error on DirectML."""

    @classmethod
    def on_target(cls, *args: Any, **kwargs: Any) -> Any:
        raise _no_graphs("CUDAGraph")


class graph(metaclass=_TorchsOffTarget):
    """``with torch.cuda.graph(g):``: a clear error on DirectML."""

    @classmethod
    def on_target(cls, *args: Any, **kwargs: Any) -> Any:
        raise _no_graphs("graph")


def graph_pool_handle() -> Any:
    """A clear error on DirectML."""
    if _target() is None:
        return _cuda("graph_pool_handle")()
    raise _no_graphs("graph_pool_handle")


def make_graphed_callables(callables: Any, *args: Any, **kwargs: Any) -> Any:
    """The callables themselves: a graphed callable computes what it computes eagerly, and
    DirectML runs it eagerly."""
    if _target() is None:
        return _cuda("make_graphed_callables")(callables, *args, **kwargs)
    return callables


# -- nvtx -----------------------------------------------------------------------------------------


class _Nvtx:
    """``torch.cuda.nvtx``: profiler ranges and marks, nothing on DirectML (torch builds without
    CUDA, such as torch-directml's, raise ``NVTX functions not installed`` instead)."""

    def __init__(self) -> None:
        self._depth = 0

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda.nvtx, name)

    def _own(self, name: str) -> Any:
        if _target() is None:
            import torch

            return getattr(torch.cuda.nvtx, name)
        return None

    def range_push(self, msg: str) -> int:
        own = self._own("range_push")
        if own is not None:
            return int(own(msg))
        self._depth += 1
        return self._depth - 1

    def range_pop(self) -> int:
        own = self._own("range_pop")
        if own is not None:
            return int(own())
        self._depth = max(self._depth - 1, 0)
        return self._depth

    def range_start(self, msg: str) -> int:
        own = self._own("range_start")
        return int(own(msg)) if own is not None else 0

    def range_end(self, range_id: int) -> None:
        own = self._own("range_end")
        if own is not None:
            own(range_id)

    def mark(self, msg: str) -> None:
        own = self._own("mark")
        if own is not None:
            own(msg)

    def range(self, msg: str, *args: Any, **kwargs: Any) -> Any:
        """A context manager (and decorator, as contextlib makes it) doing nothing."""
        own = self._own("range")
        if own is not None:
            return own(msg, *args, **kwargs)
        import contextlib

        return contextlib.nullcontext()


nvtx = _Nvtx()


# -- legacy tensor types ------------------------------------------------------------------------


class _LegacyType(type):
    """``torch.cuda.FloatTensor`` and its kin: build on the device, recognise device tensors."""

    dtype_name: str

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if _target() is None:
            return _cuda(cls.__name__)(*args, **kwargs)
        import torch

        built = getattr(torch, cls.__name__)(*args, **kwargs)
        return built.to(_cuda_device.device("cuda"))

    def __instancecheck__(cls, instance: Any) -> bool:
        if _target() is None:
            return isinstance(instance, _cuda(cls.__name__))
        import torch

        return (
            isinstance(instance, torch.Tensor)
            and instance.device.type == _resolution.current().type
            and instance.dtype == getattr(torch, cls.dtype_name)
        )

    @property
    def dtype(cls) -> Any:
        import torch

        return getattr(torch, cls.dtype_name)

    @property
    def is_cuda(cls) -> bool:
        return True


def _legacy_type(name: str) -> _LegacyType:
    return _LegacyType(name, (), {"dtype_name": _LEGACY_TYPES[name], "__module__": __name__})


FloatTensor = _legacy_type("FloatTensor")
DoubleTensor = _legacy_type("DoubleTensor")
HalfTensor = _legacy_type("HalfTensor")
BFloat16Tensor = _legacy_type("BFloat16Tensor")
ByteTensor = _legacy_type("ByteTensor")
CharTensor = _legacy_type("CharTensor")
ShortTensor = _legacy_type("ShortTensor")
IntTensor = _legacy_type("IntTensor")
LongTensor = _legacy_type("LongTensor")
BoolTensor = _legacy_type("BoolTensor")


def retype(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """``obj.type(T)`` in a module that names torch.cuda's legacy types: to the device when T is
    one (the class or its ``'torch.cuda.FloatTensor'`` name), else ``obj.type`` as written."""
    wanted = args[0] if args else kwargs.get("dtype")
    if isinstance(wanted, str):
        match = _LEGACY_TYPE_TEXT.fullmatch(wanted)
        if match is not None and match.group(1) in _LEGACY_TYPES:
            wanted = globals()[match.group(1)]
    if isinstance(wanted, _LegacyType) and _target() is not None:
        import torch

        return obj.to(
            device=_cuda_device.device("cuda"),
            dtype=getattr(torch, wanted.dtype_name),
            non_blocking=bool(kwargs.get("non_blocking", False)),
        )
    if isinstance(wanted, _LegacyType):
        args = (_cuda(wanted.__name__), *args[1:])
        kwargs.pop("dtype", None)
    return obj.type(*args, **kwargs)


def __getattr__(name: str) -> Any:
    """Other ``torch.cuda`` names, for ``from torch.cuda import Event, OutOfMemoryError``;
    ``default_generators``: the device's generator for each mapped adapter."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name == "default_generators" and _target() is not None:
        return tuple(_generator() for _ in _resolution.current().indices)
    return _cuda(name)
