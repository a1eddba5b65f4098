"""How DirectML serves one operator overload on a device tensor, decided once per overload.

* **native**: DirectML registers the overload (or its structured ``.out`` kernel), or PyTorch
  composes it of other operators on the device;
* **fallback**: none of those: DirectML's CPU fallback copies the arguments to the CPU, runs
  the CPU kernel there and copies the results back;
* **fixed**: a dmlpatch fix serves it on the device (:mod:`dmlpatch.opfix`);
* **cpu**: ``DMLPATCH_CPU_OPS`` sends it to the CPU, as a fallback would.

The answer comes from the data the simulated device is built from (a profile's op list,
:mod:`dmlpatch.gaps.registered_ops`) and from what :func:`dmlpatch.opfix.install` registered.
Two readers need it: the observer that counts operators on real DirectML, and ``dmlpatch
check``'s count of where model compute ran, for which a call on device tensors that a fallback
ran is compute on the CPU.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

NATIVE = "native"
FALLBACK = "fallback"
FIXED = "fixed"
CPU = "cpu"

#: Composite operators whose device work is one backend operator: where that one runs on the
#: CPU (``DMLPATCH_CPU_OPS=aten::convolution_overrideable``), so does the composite's compute.
REACHES = {
    "aten::convolution": "aten::convolution_overrideable",
    "aten::convolution_backward": "aten::convolution_backward_overrideable",
}


class Serving:
    """Classifies overloads for one profile (``native``: its overload names without
    ``aten::``; by default the profile's op list)."""

    def __init__(self, profile: str, native: Optional[frozenset[str]] = None) -> None:
        from dmlpatch import opfix
        from dmlpatch.gaps import registered_ops

        self._native = native if native is not None else opfix.gaps(profile).native
        index = registered_ops.load_index(None)
        self._delegates = dict(index.delegates) if index is not None else {}
        installed = opfix.installed()
        self._fixed = set(installed.fixes) if installed else set()
        self._cpu = set(installed.cpu_ops) if installed else set()
        self._kinds: dict[Any, tuple[str, str]] = {}

    def of(self, func: Any) -> tuple[str, str]:
        """(how, the name DirectML reports it under) for an ``OpOverload``."""
        known = self._kinds.get(func)
        if known is None:
            known = self._kinds[func] = self._decide(func.name())
        return known

    def _decide(self, name: str) -> tuple[str, str]:
        namespace, _, short = name.partition("::")
        reported_short = self._delegates.get(short, short) if namespace == "aten" else short
        reported = f"{namespace}::{reported_short}"
        operator = name.split(".", 1)[0]
        reached = REACHES.get(operator)
        if name in self._cpu:
            return CPU, name
        if reached is not None and reached in self._cpu:
            return CPU, reached
        if name in self._fixed:
            return FIXED, name
        if "*" in self._native or (
            namespace == "aten" and (short in self._native or reported_short in self._native)
        ):
            return NATIVE, reported
        if short not in self._delegates and any(
            torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
            for key in ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
        ):
            # PyTorch composes it of other operators on the device. (Structured operators
            # also have a composite kernel, for functionalization; DirectML still needs
            # their .out kernel.)
            return NATIVE, reported
        return FALLBACK, reported


def for_backend(backend: str, profile: Optional[str]) -> Optional[Serving]:
    """The classifier for the loaded backend (``sim`` uses the simulator's own native set),
    or None where there is no profile to read (no torch-directml release known)."""
    if profile is None:
        return None
    if backend != "sim":
        return Serving(profile)
    from dmlpatch.gaps import profiles, registered_ops
    from dmlpatch.sim import build

    if not profiles.resolve(profile).has_gaps:
        return Serving(profile, frozenset({"*"}))
    index = registered_ops.load_index(build.build_dir())
    native = frozenset(registered_ops.native_set(registered_ops.listed_ops(), index))
    return Serving(profile, native)
