"""Per-call operator accounting on a real DirectML device, at dispatch level, when asked.

torch-directml counts nothing and warns once per operator, so on real hardware the counts
come from a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that sees every operator
call below autograd. It classifies each call the way DirectML will serve it, from the same
data the simulated device uses (:mod:`dmlpatch.gaps.registered_ops`, the profile's rules):

* **native**: DirectML registers the overload (or its structured ``.out`` kernel), or PyTorch
  composes it of other operators on the device;
* **fallback**: none of those; DirectML's CPU fallback copies every device tensor argument to
  the CPU and every written argument and new result back (counted per call, with bytes);
* **refused**: the call raised one of DirectML's refusal texts;
* **fixed**: served by a dmlpatch fix, which reports itself (:mod:`dmlpatch.opfix._accounting`).

Off, it costs nothing: the mode is not on the dispatch stack and fixes report to no sink.
On, every operator call pays a Python round trip. The snapshot has the simulated device's
counter layout, so ``dmlpatch check`` reads both alike.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dmlpatch.opfix import _accounting, serving

_DEVICE_TYPE = "privateuseone"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _device_tensors(values: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(values)
    seen: dict[int, torch.Tensor] = {}
    for value in flat:
        if isinstance(value, torch.Tensor) and value.device.type == _DEVICE_TYPE:
            seen.setdefault(id(value), value)
    return list(seen.values())


class Observer(TorchDispatchMode):
    """Counts operator calls on ``privateuseone`` by how DirectML serves them."""

    def __init__(self, profile: str) -> None:
        super().__init__()
        from dmlpatch.gaps import profiles

        #: How DirectML serves each overload (check reads it for where compute ran).
        self.serving = serving.Serving(profile)
        self._refusals = {rule.message.split("{n}")[0] for rule in profiles.resolve(profile).rules}
        self._refusals.add("DirectML kernel is not implemented!")
        self._lock = threading.Lock()
        self.ops: dict[str, dict[str, int]] = {
            "native": {},
            "fixed": {},
            "fallback": {},
            "refused": {},
        }
        self.copies: dict[str, dict[str, int]] = {}
        self.first_calls: dict[str, str] = {}
        self._previous_sink: Optional[_accounting.Sink] = None

    # ---- classification ----

    def _classify(self, func: Any) -> tuple[str, str]:
        """(kind, reported name) for an overload: fixes and forced-CPU operators report
        themselves."""
        how, reported = self.serving.of(func)
        return ("self" if how in (serving.FIXED, serving.CPU) else how), reported

    # ---- counting ----

    def record(self, category: str, name: str, copies: int = 0, nbytes: int = 0) -> None:
        """Count one call (also the sink fixes and DMLPATCH_CPU_OPS report to)."""
        with self._lock:
            table = self.ops[category]
            first = name not in table and category != "native"
            table[name] = table.get(name, 0) + 1
            if copies:
                entry = self.copies.setdefault(name, {"count": 0, "bytes": 0})
                entry["count"] += copies
                entry["bytes"] += nbytes
        if first and name not in self.first_calls:
            frames = traceback.extract_stack()[:-2]
            self.first_calls[name] = "".join(traceback.format_list(frames))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = _device_tensors((args, kwargs))
        on_device = bool(inputs) or any(
            isinstance(v, torch.device) and v.type == _DEVICE_TYPE for v in kwargs.values()
        )
        if not on_device:
            return func(*args, **kwargs)
        kind, reported = self._classify(func)
        if kind == "self":
            return func(*args, **kwargs)
        try:
            result = func(*args, **kwargs)
        except RuntimeError as error:
            if any(str(error).startswith(text) for text in self._refusals):
                self.record("refused", reported)
            raise
        if kind == "native":
            self.record("native", reported)
            return result
        copies = len(inputs)
        nbytes = sum(_nbytes(t) for t in inputs)
        written = {
            id(t)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
            for t in _device_tensors(args[i] if i < len(args) else kwargs.get(a.name))
        }
        for t in inputs:
            if id(t) in written:
                copies += 1
                nbytes += _nbytes(t)
        known = {id(t) for t in inputs}
        for t in _device_tensors(result):
            if id(t) not in known:
                copies += 1
                nbytes += _nbytes(t)
        self.record("fallback", reported, copies, nbytes)
        return result

    def _from_fix(
        self, category: str, name: str, copies: int, nbytes: int, cpu_ns: int = 0
    ) -> None:
        """Fixes and DMLPATCH_CPU_OPS report here; the previous sink still hears of them."""
        self.record(category, name, copies, nbytes)
        if self._previous_sink is not None:
            self._previous_sink(category, name, copies, nbytes, cpu_ns)

    def __enter__(self) -> Observer:
        self._previous_sink = _accounting.set_sink(self._from_fix)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _accounting.set_sink(self._previous_sink)

    def snapshot(self) -> dict[str, Any]:
        """Counts in the simulated device's layout (no transfer counters on real hardware)."""
        with self._lock:
            return {
                "transfers": {},
                "syncs": None,
                "ops": {k: dict(v) for k, v in self.ops.items()},
                "copies": {k: dict(v) for k, v in self.copies.items()},
                "first_calls": dict(self.first_calls),
            }
