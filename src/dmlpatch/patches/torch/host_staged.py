"""torch.distributed on DirectML: gloo's collectives, with device tensors staged through the host.

DirectML has no NCCL, and gloo reduces CPU tensors only; DistributedDataParallel moreover runs
collectives on the device tensors themselves while it is constructed (the shape check, the
broadcast of parameters and buffers). :class:`HostStagedGloo` is a ``ProcessGroup`` that hands
every collective to a real ``ProcessGroupGloo``: CPU tensors go straight through, device tensors
are copied to the host, reduced or exchanged there by gloo, and copied back. Nothing here
implements a collective algorithm; it is only the staging around gloo's own.

Gradient buckets do not take this generic path: :func:`allreduce_hook` is a DDP communication
hook that stages each bucket once in each direction and averages on the host
(``dmlpatch.patches.torch.distributed`` registers it for DDP models on DirectML devices).

gloo itself is reached through :class:`~dmlpatch.patches.torch.gloo_handoff.GlooHandoff`, which
keeps gloo's worker thread from ever freeing a Python object (that aborts a rank that exits right
after its last step).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch._C._distributed_c10d import _create_work_from_future

from dmlpatch.patches.torch.gloo_handoff import GlooHandoff

#: The name ``init_process_group`` gets for a process group of this kind.
BACKEND = "dmlgloo"

_registered = False
_lock = threading.Lock()


def register() -> str:
    """Make ``BACKEND`` known to torch.distributed (once per process); returns its name."""
    global _registered
    with _lock:
        if not _registered:
            dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "privateuseone"])
            _registered = True
    return BACKEND


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> HostStagedGloo:
    return HostStagedGloo(store, rank, size, timeout)


def _completed(result: Any) -> Any:
    # A C++ Work completed by a future: a Python Work subclass can outlive its Python half when
    # C++ holds it (torch 2.4's DDP shape check then waits forever on the bare C++ base).
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


class _Staging:
    """Host copies of the device tensors in a collective's arguments, and the way back."""

    def __init__(self) -> None:
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def to_host(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type == "cpu" and not value.is_inference():
                return value
            # Called under torch.inference_mode() (ultralytics' validator gathers its stats
            # there), a copy would be an inference tensor that gloo may not write into.
            with torch.inference_mode(False):
                host = value.to("cpu", copy=True)
            self.pairs.append((value, host))
            return host
        if isinstance(value, list):
            return [self.to_host(item) for item in value]
        return value

    def copy_back(self, originals: Any) -> None:
        wanted = {id(t) for t in _tensors(originals)}
        for device_tensor, host in self.pairs:
            if id(device_tensor) in wanted:
                device_tensor.copy_(host)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _tensors(item)]
    return []


class HostStagedGloo(dist.ProcessGroup):
    """A process group over gloo that accepts DirectML (``privateuseone``) tensors."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.gloo = GlooHandoff(store, rank, size, timeout)

    def getBackendName(self) -> str:
        return BACKEND

    def shutdown(self) -> None:
        """``destroy_process_group`` (torch >= 2.5 calls it): wind gloo down now."""
        self.gloo.close()

    def _run(self, name: str, *args: Any) -> None:
        with torch.inference_mode(False):
            work = self.gloo.start(name, *args)
            work.wait()
        self.gloo.settle(work)

    def _staged(self, name: str, *args: Any, average: bool = False) -> Any:
        """Run gloo's ``name`` on host copies; the first argument is the one written to."""
        staging = _Staging()
        host_args = [staging.to_host(arg) for arg in args]
        self._run(name, *host_args)
        if average:
            with torch.inference_mode(False):
                for result in _tensors(host_args[0]):
                    result.div_(self.size())
        staging.copy_back(args[0])
        return _completed(args[0])

    def _reducing(self, name: str, *args: Any) -> Any:
        """A reduction; the options come last. AVG is gloo's SUM divided by the world size:
        gloo in torch 2.4 refuses AVG ("Cannot use ReduceOp.AVG with Gloo"), and ultralytics
        averages its validation loss with it."""
        opts = args[-1]
        average = opts.reduceOp == c10d.ReduceOp.AVG
        if average:
            opts.reduceOp = c10d.ReduceOp.SUM
        return self._staged(name, *args, average=average)

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._reducing("allreduce", tensors, _or_default(opts, c10d.AllreduceOptions))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        return self._reducing(
            "allreduce_coalesced", tensors, _or_default(opts, c10d.AllreduceCoalescedOptions)
        )

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        return self._staged("broadcast", tensors, _or_default(opts, c10d.BroadcastOptions))

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        return self._reducing("reduce", tensors, _or_default(opts, c10d.ReduceOptions))

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._staged("allgather", outputs, inputs, _or_default(opts, c10d.AllgatherOptions))

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._staged(
            "_allgather_base", output, input, _or_default(opts, c10d.AllgatherOptions)
        )

    def gather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._staged("gather", outputs, inputs, _or_default(opts, c10d.GatherOptions))

    def scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._staged("scatter", outputs, inputs, _or_default(opts, c10d.ScatterOptions))

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self._reducing(
            "reduce_scatter", outputs, inputs, _or_default(opts, c10d.ReduceScatterOptions)
        )

    def alltoall_base(
        self, output: Any, input: Any, output_splits: Any, input_splits: Any, opts: Any = None
    ) -> Any:
        return self._staged(
            "alltoall_base",
            output,
            input,
            output_splits,
            input_splits,
            _or_default(opts, c10d.AllToAllOptions),
        )

    def send(self, tensors: Any, dst: int, tag: int = 0) -> Any:
        self._run("send", _Staging().to_host(tensors), dst, tag)
        return _completed(tensors)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> Any:
        return self._staged("recv", tensors, src, tag)

    def barrier(self, opts: Any = None) -> Any:
        self._run("barrier", _or_default(opts, c10d.BarrierOptions))
        return _completed([])


def _or_default(opts: Any, kind: Callable[[], Any]) -> Any:
    return kind() if opts is None else opts


def allreduce_hook(group: HostStagedGloo, bucket: Any) -> Any:
    """DDP communication hook: average a gradient bucket over gloo, through the host.

    One device-to-host copy of the flat bucket, gloo's allreduce on it, and one host-to-device
    copy into the bucket when gloo completes (made by the handoff's Python thread, while the
    backward pass goes on); the division by the world size is done on the host, as DDP's
    default hook does it before reducing.
    """
    buffer = bucket.buffer()
    host = buffer.to("cpu")
    host.div_(group.size())
    work = group.gloo.start("allreduce", [host])
    return group.gloo.then_copy(work, host, buffer)


# DDP compares a hook's annotations with the dist.GradBucket and Future[Tensor] objects;
# postponed annotations are strings, so the hook shows it none.
allreduce_hook.__annotations__ = {}
