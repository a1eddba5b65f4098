"""Watchers on DirectML's bool-making operators, until the first bool tensor is on the device.

:mod:`dmlpatch.opfix.triggers` installs the fix for ``x * mask`` once a bool tensor exists on
the device. Copies and allocations are seen anyway; comparisons (``x > 0``), ``any``/``all``,
``isin``, ``signbit`` and ``isnan`` make bool tensors inside DirectML's own kernels, and
``zeros_like``/``ones_like``/``full_like`` with ``dtype=torch.bool`` allocate without passing
an allocation kernel of dmlpatch's. Until the first bool tensor appears each of these operators
passes through a kernel here that computes it as PyTorch composes it for any backend (the
structured ``.out`` kernel DirectML has, or the composite) and reports the result's dtype.
Then the watchers stand aside: they are removed at the next call of a fix that runs in Python
anyway, so that no watcher is removed while it runs, and the operators are DirectML's again.
``torch.empty_like(x, dtype=torch.bool)`` is not watched: ``empty_like`` serves every
``clone``, and a bool tensor it makes is uninitialised until written by a watched operator or
a copy.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

from dmlpatch import changes
from dmlpatch.opfix import triggers

_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional

#: The functional overloads that make a bool tensor from tensors of other dtypes inside
#: DirectML's kernels, each computed through its structured composite.
WATCHED = (
    "eq.Tensor",
    "eq.Scalar",
    "ne.Tensor",
    "ne.Scalar",
    "lt.Tensor",
    "lt.Scalar",
    "le.Tensor",
    "le.Scalar",
    "gt.Tensor",
    "gt.Scalar",
    "ge.Tensor",
    "ge.Scalar",
    "signbit",
    "isin.Tensor_Tensor",
    "isin.Tensor_Scalar",
    "isin.Scalar_Tensor",
    "any",
    "any.dim",
    "any.dims",
    "all",
    "all.dim",
    "all.dims",
)
#: Allocating operators a dtype can be asked of, computed through their composite.
WATCHED_LIKE = ("zeros_like", "ones_like", "full_like")
_EXPLICIT = torch._C.DispatchKey.CompositeExplicitAutograd

_lock = threading.Lock()
_library: Optional[torch.library.Library] = None
_retired: Optional[torch.library.Library] = None


def _watcher(op: torch._ops.OpOverload, key: Any) -> Callable[..., Any]:
    def watch(*args: Any, **kwargs: Any) -> Any:
        result = op._op_dk(key, *args, **kwargs)
        triggers.seen(result.dtype)
        return result

    return watch


def _isnan(self: torch.Tensor) -> torch.Tensor:
    # DirectML's isnan has no composite to compute it through: a NaN is what is not itself.
    result = (
        torch.ne(self, self)
        if self.is_floating_point()
        else torch.zeros_like(self, dtype=torch.bool)
    )
    triggers.seen(torch.bool)
    return result


def install() -> None:
    """Watch the bool-making operators until a bool tensor is on the device."""
    global _library
    with _lock:
        if _library is not None or not triggers.waiting_for(torch.bool):
            return
        library = torch.library.Library("aten", "IMPL")
        for name in WATCHED:
            packet_name, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, packet_name), overload or "default")
            library.impl(name, _watcher(op, _COMPOSITE), "PrivateUse1")
        for name in WATCHED_LIKE:
            op = getattr(torch.ops.aten, name).default
            library.impl(name, _watcher(op, _EXPLICIT), "PrivateUse1")
        library.impl("isnan", _isnan, "PrivateUse1")
        _library = library
        changes.record(
            __name__,
            "kernels",
            "watchers of the operators that make the device's first bool tensor",
            uninstall,
        )
    triggers.when_fired(torch.bool, _retire)


def _retire() -> None:
    """The first bool tensor is here: the watchers go at the next safe point."""
    global _library, _retired
    with _lock:
        _retired, _library = _library, None


def stand_aside() -> None:
    """Remove retired watchers; called by fixes that run in Python anyway (never by a watcher,
    so none is removed while it runs)."""
    global _retired
    if _retired is None:
        return
    with _lock:
        retired, _retired = _retired, None
    if retired is not None:
        retired._destroy()


def uninstall() -> None:
    global _library, _retired
    changes.forget(__name__)
    with _lock:
        for library in (_library, _retired):
            if library is not None:
                library._destroy()
        _library = _retired = None
