"""Where work runs: one answer per process, from a device spec.

Specs: ``auto`` (default), ``dml``, ``dml:N``, ``dml:N,M``, ``dml:NAME`` (case-insensitive
substring of the adapter name), ``privateuseone:N`` (same as ``dml:N``), ``sim``, ``sim:N``,
``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``xpu``. The spec comes from :func:`configure`, else
``$DMLPATCH_DEVICE``, else ``auto``. Parsing needs no torch; resolving imports it.
:func:`resolve` only answers; :func:`current` commits the process to the answer and runs the
hooks start-up registered with :func:`on_commit` (the operator fixes of a DirectML backend,
:mod:`dmlpatch.startup.commitment`) before anyone else sees it. This module installs nothing.
"""

from __future__ import annotations

import _thread  # threading.Lock and RLock are these; importing threading costs start-up
import os

from dmlpatch.devices.spec import SPEC_HELP, Spec, parse
from dmlpatch.environment_variables import DMLPATCH_DEVICE
from dmlpatch.errors import DeviceUnavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, NamedTuple, Optional
else:
    from dmlpatch._tuple import NamedTuple


#: Parsing lives in :mod:`dmlpatch.devices.spec`; its names stay importable from here.
__all__ = ["SPEC_HELP", "Resolution", "Spec", "configure", "current", "parse", "resolve"]


class Resolution(NamedTuple):
    """The device this process targets, and why."""

    spec: str
    backend: str  # directml | sim | cuda | mps | xpu | cpu
    type: str  # torch device type
    indices: tuple[int, ...]  # the program's ordinal i is adapter indices[i]
    names: tuple[str, ...]  # adapter names, parallel to indices
    why: str

    @property
    def device(self) -> str:
        return f"{self.type}:{self.indices[0]}" if self.indices else self.type

    @property
    def adapter(self) -> Optional[str]:
        return self.names[0] if self.names else None

    @property
    def is_accelerator(self) -> bool:
        return self.backend != "cpu"

    @property
    def patches_needed(self) -> bool:
        """A usable CUDA GPU runs CUDA programs as written: then dmlpatch stays out of the way."""
        return self.backend != "cuda"

    def adapter_name(self, index: int) -> str:
        if index in self.indices:
            return self.names[self.indices.index(index)]
        return f"{self.type}:{index}"

    def describe_indices(self) -> str:
        return ", ".join(f"{self.type}:{i}" for i in self.indices) or self.type

    def torch_device(self) -> Any:
        import torch

        return torch.device(self.device)

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "backend": self.backend,
            "device": self.device,
            "adapter": self.adapter,
            "adapters": [{"index": i, "name": n} for i, n in zip(self.indices, self.names)],
            "why": self.why,
        }


_lock = _thread.RLock()
_configured: Optional[str] = None
_current: Optional[Resolution] = None
_resolving = False
_listeners: list[Callable[[Resolution], None]] = []
#: What committing to a resolution sets up, registered by start-up (:func:`on_commit`).
_commit_hooks: list[Callable[[Resolution], None]] = []


def configure(spec: Optional[str]) -> None:
    """Set this process's spec (validated now, resolved on first use)."""
    global _configured, _current
    if spec is not None:
        parse(spec)
    with _lock:
        if spec == _configured:
            return  # already configured, perhaps resolved: keep the answer
        _configured = spec
        _current = None


def configured_spec() -> str:
    return _configured or os.environ.get(DMLPATCH_DEVICE) or "auto"


def current() -> Resolution:
    """The process's resolution, computed once; listeners hear of it as soon as it exists."""
    global _current, _resolving
    resolved = _current
    if resolved is not None:  # every rewritten site asks: no lock once it exists
        return resolved
    with _lock:
        if _current is None:
            _resolving = True
            try:
                resolved = resolve(configured_spec())
                # Before the answer is published: no thread may reach the device before what
                # committing to it sets up (the operator fixes) is in place.
                for hook in list(_commit_hooks):
                    hook(resolved)
            finally:
                _resolving = False
            _current = resolved
            for listener in _listeners:
                listener(resolved)
        return _current


def on_commit(hook: Callable[[Resolution], None]) -> None:
    """Call ``hook`` with the resolution when the process commits to it, before it is
    published; now, if it already is. Registering a hook twice changes nothing."""
    with _lock:
        if hook in _commit_hooks:
            return
        _commit_hooks.append(hook)
        if _current is not None:
            hook(_current)


def forget_on_commit(hook: Callable[[Resolution], None]) -> None:
    """Undo :func:`on_commit`."""
    with _lock:
        if hook in _commit_hooks:
            _commit_hooks.remove(hook)


def resolving() -> bool:
    """Whether a resolution is under way (it imports torch, which must not start another)."""
    return _resolving


def when_resolved(listener: Callable[[Resolution], None]) -> None:
    """Call ``listener`` with the resolution once it is made (now, if it already was)."""
    with _lock:
        if _current is not None:
            listener(_current)
        else:
            _listeners.append(listener)


def forget_when_resolved(listener: Callable[[Resolution], None]) -> None:
    """Undo :func:`when_resolved` for a resolution not made yet."""
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def resolved_or_none() -> Optional[Resolution]:
    return _current


def precheck() -> Optional[Resolution]:
    """Before the program runs: refuse what is wrong without importing torch, and resolve a
    spec that needs no torch (``cpu``). None: resolving must wait for torch.

    A program's settings before its own ``import torch`` (``OMP_NUM_THREADS``,
    ``CUDA_VISIBLE_DEVICES``, warning filters) hold only if torch is not imported for it.
    """
    spec = parse(configured_spec())
    if spec.kind == "cpu":
        return current()  # resolving "cpu" imports nothing
    if spec.kind == "dml":
        from dmlpatch.devices import directml

        reason = directml.precheck()
        if reason is not None:
            raise DeviceUnavailable(f"DirectML unavailable: {reason}")
    if spec.kind == "sim":
        from dmlpatch import sim

        _select(spec, tuple(sim.precheck()), "simulated DirectML")
    return None


def resolve(text: str) -> Resolution:
    """Resolve a spec now; :class:`DeviceUnavailable` when an explicit request cannot be met."""
    spec = parse(text)
    resolver = _RESOLVERS[spec.kind]
    return resolver(spec)


def _resolve_cpu(spec: Spec) -> Resolution:
    return Resolution(spec.text, "cpu", "cpu", (), (), "requested with --device cpu")


def _resolve_auto(spec: Spec) -> Resolution:
    reasons = []
    usable, why = cuda_status()
    if usable:
        return _resolve_cuda(Spec("cuda", "cuda"), why=f"auto: {why}; the program runs as written")
    reasons.append(why)
    from dmlpatch.devices import directml

    found = directml.probe()
    if found.available:
        return _directml_resolution(spec, found, (0,), f"auto: {why}; DirectML: {found.reason}")
    reasons.append(f"DirectML unavailable: {found.reason}")
    import torch

    if _mps_available(torch):
        return Resolution(
            spec.text, "mps", "mps", (0,), ("Apple MPS",), "auto: " + "; ".join(reasons)
        )
    if _xpu_available(torch):
        name = str(torch.xpu.get_device_name(0))
        return Resolution(spec.text, "xpu", "xpu", (0,), (name,), "auto: " + "; ".join(reasons))
    return Resolution(
        spec.text, "cpu", "cpu", (), (), "auto: " + "; ".join(reasons) + "; using the CPU"
    )


def _resolve_dml(spec: Spec) -> Resolution:
    from dmlpatch.devices import directml

    found = directml.probe()
    if not found.available:
        raise DeviceUnavailable(f"DirectML unavailable: {found.reason}")
    indices = _select(spec, found.names, "DirectML")
    return _directml_resolution(spec, found, indices, f"requested {spec.text}")


def _directml_resolution(spec: Spec, found: Any, indices: tuple[int, ...], why: str) -> Resolution:
    names = tuple(found.names[i] for i in indices)
    return Resolution(spec.text, "directml", "privateuseone", indices, names, why)


def _resolve_sim(spec: Spec) -> Resolution:
    from dmlpatch import sim

    sim.load()
    names = tuple(sim.device_name(i) for i in range(sim.device_count()))
    indices = _select(spec, names, "simulated DirectML")
    return Resolution(
        spec.text,
        "sim",
        "privateuseone",
        indices,
        tuple(names[i] for i in indices),
        f"requested {spec.text}: simulated DirectML device, profile {sim.profile()}",
    )


def _select(spec: Spec, names: tuple[str, ...], what: str) -> tuple[int, ...]:
    if spec.name is not None:
        matches = [i for i, n in enumerate(names) if spec.name.lower() in n.lower()]
        if not matches:
            listed = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
            raise DeviceUnavailable(f"no {what} adapter matches {spec.name!r} (adapters: {listed})")
        return (matches[0],)
    indices = spec.indices or (0,)
    for index in indices:
        if index >= len(names):
            raise DeviceUnavailable(
                f"{what} adapter {index} does not exist ({len(names)} adapter(s): "
                f"{', '.join(names)})"
            )
    return indices


def _resolve_cuda(spec: Spec, why: Optional[str] = None) -> Resolution:
    usable, reason = cuda_status()
    if not usable:
        raise DeviceUnavailable(f"CUDA unavailable: {reason}")
    import torch

    index = spec.indices[0] if spec.indices else 0
    if index >= torch.cuda.device_count():
        raise DeviceUnavailable(f"CUDA device {index} does not exist")
    name = str(torch.cuda.get_device_name(index))
    return Resolution(spec.text, "cuda", "cuda", (index,), (name,), why or f"requested {spec.text}")


def _resolve_mps(spec: Spec) -> Resolution:
    import torch

    if not _mps_available(torch):
        raise DeviceUnavailable("MPS unavailable: this torch build or machine has no Apple MPS")
    return Resolution(spec.text, "mps", "mps", (0,), ("Apple MPS",), f"requested {spec.text}")


def _resolve_xpu(spec: Spec) -> Resolution:
    import torch

    if not _xpu_available(torch):
        raise DeviceUnavailable("XPU unavailable: this torch build or machine has no Intel XPU")
    index = spec.indices[0] if spec.indices else 0
    return Resolution(
        spec.text,
        "xpu",
        "xpu",
        (index,),
        (str(torch.xpu.get_device_name(index)),),
        f"requested {spec.text}",
    )


_RESOLVERS = {
    "auto": _resolve_auto,
    "cpu": _resolve_cpu,
    "dml": _resolve_dml,
    "sim": _resolve_sim,
    "cuda": _resolve_cuda,
    "mps": _resolve_mps,
    "xpu": _resolve_xpu,
}


def cuda_status() -> tuple[bool, str]:
    """Is CUDA usable, not just present? A GPU this build has no kernels for is not."""
    import torch

    if not torch.cuda.is_available():
        built = "a CPU-only torch build" if torch.version.cuda is None else "no CUDA GPU found"
        return False, f"CUDA unavailable ({built})"
    capability = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    arch_list = list(torch.cuda.get_arch_list())
    if not capability_supported(capability, arch_list):
        return False, (
            f"CUDA GPU {name} has compute capability {capability[0]}.{capability[1]}, "
            f"which this torch build does not support (built for {' '.join(arch_list)})"
        )
    return True, f"CUDA GPU {name} (capability {capability[0]}.{capability[1]}) is usable"


def capability_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """True when the build has SASS for this capability, or PTX it can JIT-compile from.

    ``sm_XY`` runs on devices of the same major version and minor >= Y; ``compute_XY`` (PTX)
    runs on any device of capability >= X.Y.
    """
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit():
            continue
        arch_major, arch_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def _mps_available(torch: Any) -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _xpu_available(torch: Any) -> bool:
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())
