"""``dmlpatch check``'s exhaustive accounting: every heavy ATen call, wherever it ran.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees each operator below autograd,
functional calls and backward included, so a matrix product written as ``x @ w`` on the CPU is
counted as surely as a CPU ``nn.Linear``. Each CPU call walks the Python stack for its source
line; that costs tens of microseconds, which ``check`` can afford and an ordinary run need not.

A call on device tensors is not always device compute: an operator DirectML lacks runs through
its CPU fallback (the arguments copied out, the CPU kernel, the results copied back), and
``DMLPATCH_CPU_OPS`` sends named operators the same way. Given how the backend serves each
operator (:mod:`dmlpatch.opfix.serving`), such calls count as CPU compute, with the line and
the operator.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch._C import _is_tracing
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dmlpatch import log
from dmlpatch.placement import families, frames, ledger

if TYPE_CHECKING:
    from dmlpatch.opfix.serving import Serving


def _device_of(values: Any) -> str:
    """The device type the call computed on: an accelerator's when any argument is there."""
    flat, _ = tree_flatten(values)
    found = ""
    for value in flat:
        if isinstance(value, torch.Tensor):
            kind = value.device.type
            if kind != "cpu":
                return kind
            if value.dim() > 0 or not found:  # a CPU scalar beside device tensors is normal
                found = kind
    return found


class Counter(TorchDispatchMode):
    """Fills a ledger (``counted='operators'``) while it is on the dispatch stack.

    ``serving``: how the backend serves each operator; without it every call on device
    tensors counts as device compute.
    """

    def __init__(self, serving: Optional[Serving] = None) -> None:
        super().__init__()
        self.ledger = ledger.start("operators")
        self._families: dict[Any, Any] = {}
        self._serving = serving
        #: What dmlpatch's fix kernels recorded during the call under way (``(category,
        #: operator)``: ``fixed`` on the device, or ``fallback`` through the CPU), or None.
        self._records: Optional[list[tuple[str, str]]] = None
        self._sink_before: Any = None

    def __enter__(self) -> Any:
        # A fix kernel says per call whether it served the call on the device or sent it
        # through the CPU (a matrix wider than its limit, float16 on the host): the operator's
        # name alone cannot tell.
        from dmlpatch.opfix import _accounting

        self._sink_before = _accounting.set_sink(self._heard)
        return super().__enter__()

    def _heard(self, category: str, name: str, copies: int, nbytes: int, cpu_ns: int = 0) -> None:
        if self._records is not None:
            self._records.append((category, name))
        if self._sink_before is not None:
            self._sink_before(category, name, copies, nbytes, cpu_ns)

    def __exit__(self, *exc: Any) -> Any:
        from dmlpatch.opfix import _accounting

        _accounting.set_sink(self._sink_before)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        outer = self._records
        records: list[tuple[str, str]] = []
        self._records = records
        started = perf_counter()
        try:
            result = func(*args, **kwargs)
        finally:
            self._records = outer
        seconds = perf_counter() - started
        try:  # accounting never breaks the program
            through_cpu = next((name for kind, name in records if kind == "fallback"), None)
            if self.ledger.keeps_lines:
                site = frames.site(depth=1)
                for kind, name in records:
                    if kind == "fixed":
                        self.ledger.note_device_line(site, families.OTHER, 0, name)
            self._count(func, args, kwargs, result, seconds, through_cpu)
        except Exception as error:
            log.swallowed("the count of an operator", error)
        return result

    def _count(
        self,
        func: Any,
        args: Any,
        kwargs: Any,
        result: Any,
        seconds: float,
        through_cpu: Optional[str] = None,
    ) -> None:
        """Count one call; ``through_cpu``: the operator a fix kernel sent through the CPU
        during it (it says so per call)."""
        known = self._families.get(func, False)
        if known is False:
            name = func._schema.name.partition("::")[2]
            known = (name, families.operator_family(name))
            self._families[func] = known
        name, family = known
        if (family is None and self._serving is None) or _is_tracing():
            # torch.jit.trace's recording run (see module_hooks): not the program's compute.
            return
        kind = _device_of((args, kwargs)) or _device_of(result)
        if kind in ("", "meta"):
            return
        fallback = None
        if through_cpu is not None:
            kind, fallback = "cpu", through_cpu
        elif kind != "cpu" and self._serving is not None:
            how, reported = self._serving.of(func)
            if how in ("fallback", "cpu"):
                kind, fallback = "cpu", reported
        book = self.ledger
        if family is None:
            # Of the operators outside the families, only fallbacks count: CPU work on the
            # device's data, estimated by the elements they read and write.
            if fallback is None:
                return
            family, flops = families.OTHER, families.elements((args, kwargs), result)
        else:
            flops = families.operator_flops(name, tuple(args), result)
        if kind == "cpu":
            # Frames: _count, __torch_dispatch__, then torch's dispatch machinery.
            caller = frames.caller(depth=2)
            if caller.site is None:  # autograd's device thread: the forward line, if recorded
                caller = caller._replace(site=_forward_site())
            if caller.building:
                book.add(ledger.BUILDING, flops)
            elif caller.loading:
                book.add(ledger.LOADING, flops)
            else:
                # A fallback's copies are the backend's count, per operator (None here).
                copies = None if fallback is not None else 0
                book.add_cpu(caller.site, family, flops, fallback, copies, 0, seconds)
        elif book.keeps_lines:
            book.add_device(kind, flops, frames.site(depth=2), family)
        else:
            book.add(kind, flops)


def _forward_site() -> Optional[frames.Site]:
    from dmlpatch.placement import backward_lines

    line = backward_lines.forward_line(torch._C._current_autograd_node())
    return None if line is None else frames.Site(line.file, line.line, line.function)


#: What ``torch.jit`` traces with; each cannot record under a dispatch mode.
_TRACERS = ("trace", "trace_module")


@contextlib.contextmanager
def traces_unobserved() -> Iterator[None]:
    """``torch.jit.trace`` runs outside ``check``'s dispatch modes while this is open.

    Under any TorchDispatchMode the tracer fails ("Cannot insert a Tensor that requires grad as
    a constant"): a program that traces its model for TensorBoard (yolov5) or export would
    fail under ``check`` alone. A trace re-runs a forward to record it, so nothing the program
    computes goes uncounted.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    def unobserved(trace: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(trace)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with _disable_current_modes():
                return trace(*args, **kwargs)

        return traced

    originals = {name: getattr(torch.jit, name) for name in _TRACERS}
    for name, trace in originals.items():
        setattr(torch.jit, name, unobserved(trace))
    try:
        yield
    finally:
        for name, trace in originals.items():
            setattr(torch.jit, name, trace)
