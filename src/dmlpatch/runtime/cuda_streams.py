"""``torch.cuda.Stream`` / ``Event`` and the stream functions on DirectML.

DirectML runs one queue per adapter, so a stream is that queue and an event records the time
after draining it (``elapsed_time`` in milliseconds, as CUDA's).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime.cuda_target import TorchsOffTarget as _TorchsOffTarget
from dmlpatch.runtime.cuda_target import adapter as _adapter
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda


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
