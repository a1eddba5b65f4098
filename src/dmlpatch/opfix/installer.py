"""Installing the operator fixes. Each fix the backend's gaps call for (declared in
:mod:`dmlpatch.opfix.registry`) is registered through :mod:`torch.library` in libraries of its
own, so that one torch refuses is named in one line and taken out alone while the others stay;
then the ``DMLPATCH_CPU_OPS`` operators, and PyTorch's own ``PrivateUse1`` gaps (module moves,
sharing, the device module). Everything installed is in the process's ledger
(:mod:`dmlpatch.changes`), and :func:`uninstall` takes it out again, every fix's state reset."""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import TYPE_CHECKING, NamedTuple, Optional

from dmlpatch.environment_variables import DMLPATCH_CPU_OPS
from dmlpatch.opfix import registry

if TYPE_CHECKING:
    import torch

    from dmlpatch.opfix._kernel import Kernel


class Installed(NamedTuple):
    """What :func:`install` registered: operator overloads served by fixes, and forced to CPU."""

    backend: str
    profile: Optional[str]
    fixes: tuple[str, ...]
    cpu_ops: tuple[str, ...]
    #: Fixes that failed to register (each said in one line), by name: DirectML's own
    #: behaviour stands for their operators.
    failed: tuple[str, ...] = ()


_lock = threading.Lock()
#: The library of the DMLPATCH_CPU_OPS operators.
_library: Optional[torch.library.Library] = None
_installed: Optional[Installed] = None
#: Each installed fix's libraries (one per operator namespace and installation), by name.
_libraries: dict[str, list[torch.library.Library]] = {}
#: Libraries of the fixes installed when their trigger fired.
_triggered: list[torch.library.Library] = []


class Gaps(NamedTuple):
    """What a profile lacks: operators with refusal rules, the overloads DirectML runs natively
    (names without ``aten::``; everything else falls back to the CPU), its wrong answers and
    the dtypes it cannot hold (c10 names: ``BFloat16``, ``ComplexFloat``, ``Double``...)."""

    refused: frozenset[str]
    native: frozenset[str]
    quirks: frozenset[str]
    dtypes: frozenset[str] = frozenset()


def gaps(profile: str) -> Gaps:
    """The gaps of a profile (see :class:`Gaps`)."""
    from dmlpatch.gaps import profiles, registered_ops

    chosen = profiles.resolve(profile)
    refused = profiles.refused_ops(profile)
    quirks = profiles.quirks(profile)
    dtypes = frozenset(chosen.unsupported_dtypes)
    if not chosen.has_gaps:
        return Gaps(refused, frozenset({"*"}), quirks, dtypes)
    native = frozenset(registered_ops.native_set(registered_ops.listed_ops(), None))
    return Gaps(refused, native, quirks, dtypes)


def kernels() -> list[Kernel]:
    """Every fix kernel this package has, each fix's after those of the fixes it yields to."""
    return [kernel for fix in registry.fixes() for kernel in fix.kernels]


def needed(kernel: Kernel, gaps: Gaps) -> bool:
    """Whether a profile has the gap ``kernel`` fixes."""
    if kernel.quirk and kernel.quirk in gaps.quirks:
        return True
    if kernel.gap == "dtype":
        return bool(gaps.dtypes)
    if kernel.gap == "autocast":
        # No DirectML release serves the autocast key: one of its gaps, which a profile
        # without gaps (``permissive``) does not reproduce.
        return "*" not in gaps.native
    if kernel.gap == "refused":
        return kernel.op in gaps.refused
    if kernel.gap == "quirk":
        return kernel.quirk in gaps.quirks
    return (
        "*" not in gaps.native
        and kernel.name not in gaps.native
        and (not kernel.delegate or kernel.delegate not in gaps.native)
    )


def install(backend: str, profile_or_version: Optional[str]) -> Installed:
    """Register the fixes ``backend`` needs (``sim`` with a profile name, ``directml`` with the
    torch-directml version) and the ``DMLPATCH_CPU_OPS`` operators; idempotent per process.

    Returns what was installed. Raises :class:`~dmlpatch.errors.UsageError` for a bad
    ``DMLPATCH_CPU_OPS``.
    """
    global _library, _installed
    import torch

    from dmlpatch.gaps import profiles
    from dmlpatch.opfix import (
        _accounting,
        cpu_ops,
        device_module,
        module_moves,
        shared_modules,
        sharing,
    )

    with _lock:
        if _installed is not None:
            return _installed
        if backend == "sim":
            profile: Optional[str] = profile_or_version
            _accounting.use_sim_counters()
        elif backend == "directml":
            profile = profiles.profile_for_release(profile_or_version)
        else:
            raise ValueError(f"op fixes are for the sim and directml backends, not {backend!r}")
        forced_ops = cpu_ops.resolve(os.environ.get(DMLPATCH_CPU_OPS, ""))
        # PyTorch's, not DirectML's: every PrivateUse1 device has them, whatever the profile.
        module_moves.install()
        shared_modules.install()  # after module_moves: it wraps Module._apply too
        sharing.install()
        device_module.install()
        forced_names = {op.name() for op in forced_ops}
        fixes: list[str] = []
        served: set[tuple[str, bool]] = set()
        failed: list[str] = []
        if profile is not None:
            missing = gaps(profile)
            float64 = _float64_everywhere(backend)
            if float64 is False:
                missing = missing._replace(dtypes=missing.dtypes | {"Double"})
            _configure_dtypes(missing, float64, _adapter_count(backend))
            waiting: dict[str, list[tuple[str, Kernel]]] = {}
            for fix in registry.fixes():
                now: list[Kernel] = []
                for kernel in fix.kernels:
                    # A user's DMLPATCH_CPU_OPS entry wins over our fix; of two fixes for one
                    # operator, the one the other yields to (it comes first).
                    taken = _slot(kernel) in served or (
                        kernel.qualified in forced_names and not kernel.casts
                    )
                    if taken or not _installed_library(kernel.namespace):
                        continue
                    if needed(kernel, missing):
                        if kernel.trigger:
                            waiting.setdefault(kernel.trigger, []).append((fix.name, kernel))
                        else:
                            now.append(kernel)
                        if not kernel.casts:  # autocast's kernels compute nothing
                            fixes.append(kernel.qualified)
                        served.add(_slot(kernel))
                if now and _register(fix.name, now) is None:
                    failed.append(fix.name)
                    dropped = {kernel.qualified for kernel in now}
                    fixes[:] = [name for name in fixes if name not in dropped]
                    served -= {_slot(kernel) for kernel in now}
                    continue
            _wait_for_triggers(waiting)
        library = torch.library.Library("aten", "IMPL")
        forced = cpu_ops.register(library, forced_ops)
        _library = library
        _installed = Installed(backend, profile, tuple(fixes), tuple(forced), tuple(failed))
        from dmlpatch import changes

        changes.record(
            __name__,
            "kernels",
            f"{len(fixes)} operator fixes for DirectML's gaps"
            + (f" and {len(forced)} {DMLPATCH_CPU_OPS} operators" if forced else "")
            + " registered for PrivateUse1 through torch.library",
            uninstall,
        )
        return _installed


def _slot(kernel: Kernel) -> tuple[str, bool]:
    """What one fix's kernel takes from another's: an operator, the computing or the casting
    of it."""
    return kernel.qualified, kernel.casts


def _register(name: str, chosen: list[Kernel]) -> Optional[list[torch.library.Library]]:
    """Register the kernels of fix ``name`` in libraries of their own, and return them; None,
    said in one line and with nothing of it left registered, when torch refuses one."""
    import torch

    from dmlpatch import log

    libraries: dict[str, torch.library.Library] = {}
    try:
        for kernel in chosen:
            into = libraries.get(kernel.namespace)
            if into is None:
                into = libraries[kernel.namespace] = torch.library.Library(kernel.namespace, "IMPL")
            with warnings.catch_warnings():
                # torch 2.4 warns when a Python kernel replaces the simulator's registration
                # for the same key: replacing it is the point.
                warnings.filterwarnings("ignore", "Warning only once for all operators")
                into.impl(kernel.name, kernel.function, kernel.key)
    except RuntimeError as error:
        for library in libraries.values():
            library._destroy()
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        log.warn_once(
            f"opfix:{name}",
            f"operator fix {name} not installed ({first}); DirectML's own behaviour stands "
            "for its operators",
        )
        return None
    _libraries.setdefault(name, []).extend(libraries.values())
    return list(libraries.values())


def _installed_library(namespace: str) -> bool:
    """Whether the operator library ``namespace`` can exist in this process: aten always, a
    package's own where the package is installed (it need not be imported yet: the dispatcher
    keeps an implementation registered ahead of its operator's schema)."""
    if namespace == "aten":
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(namespace) is not None
    except (ImportError, ValueError):
        return False


def _wait_for_triggers(waiting: dict[str, list[tuple[str, Kernel]]]) -> None:
    """Fixes with a trigger are installed when a tensor of its dtype is first on the device
    (:mod:`dmlpatch.opfix.triggers`), each set in a library of its own."""
    import torch

    from dmlpatch.opfix import sentinels, triggers

    owners = {
        (kernel.qualified, kernel.key): name for pairs in waiting.values() for name, kernel in pairs
    }

    def install_now(chosen: list[Kernel]) -> None:
        by_fix: dict[str, list[Kernel]] = {}
        for kernel in chosen:
            by_fix.setdefault(owners[(kernel.qualified, kernel.key)], []).append(kernel)
        for name, kernels in by_fix.items():
            _triggered.extend(_register(name, kernels) or ())

    from dmlpatch.opfix import dtype_policy
    from dmlpatch.opfix.tensors import allocation, transfers

    if dtype_policy.current() is None:
        # No allocation and copy kernels to see a trigger with: install them at once.
        for pairs in waiting.values():
            install_now([kernel for _, kernel in pairs])
        return

    def watched(dtype: torch.dtype, watching: bool) -> None:
        # Until it fires, allocations and copies of the dtype take the path that tells it.
        plain, waiting_now = allocation._plain, transfers._waiting
        allocation.plain_dtypes(plain - {dtype} if watching else plain | {dtype})
        transfers.watch_triggers(waiting_now | {dtype} if watching else waiting_now - {dtype})

    for dtype_name, pairs in waiting.items():
        dtype = getattr(torch, dtype_name)
        triggers.wait(dtype, [kernel for _, kernel in pairs], install_now)
        watched(dtype, True)
        triggers.when_fired(dtype, functools.partial(watched, dtype, False))
    sentinels.install()


def arm_all() -> None:
    """Install every fix that waits for a trigger now: before a program goes multithreaded on
    the device (DataParallel's replica threads), so that nothing is registered while another
    thread dispatches."""
    import torch

    from dmlpatch.opfix import triggers

    for dtype in (torch.bool, torch.uint8):
        triggers.seen(dtype)


def _all_dtypes() -> list[torch.dtype]:
    import torch

    return [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex32,
        torch.complex64,
        torch.complex128,
    ]


def _float64_everywhere(backend: str) -> Optional[bool]:
    """Whether every adapter has float64: the simulator's setting; None on DirectML, whose
    adapters are asked one by one when a float64 tensor comes their way."""
    if backend != "sim":
        return None
    from dmlpatch import sim

    return sim.has_float64()


def _adapter_count(backend: str) -> int:
    if backend == "sim":
        from dmlpatch import sim

        return sim.device_count()
    import torch_directml  # loaded already: the fixes are installed for it

    count: int = torch_directml.device_count()
    return count


def _configure_dtypes(missing: Gaps, float64: Optional[bool], adapters: int) -> None:
    from dmlpatch.opfix import dtype_policy
    from dmlpatch.opfix.tensors import allocation, transfers

    transfers.between_adapters("device-to-device" in missing.quirks, adapters)
    if missing.dtypes or float64 is None:
        import torch

        policy = dtype_policy.configure(missing.dtypes, float64)
        allocation.install_load_hook()
        attention = set(policy.unsupported) | set(policy.parts)
        if float64 is not True:  # float64 takes the policy's path where adapters may lack it
            attention.add(torch.float64)
        transfers.watch_dtypes(frozenset(attention))
        allocation.plain_dtypes(frozenset(_all_dtypes()) - attention)


def install_for(backend: str) -> Optional[Installed]:
    """:func:`install` for the loaded ``sim`` or ``directml`` backend (its profile or release).

    A fix that fails to register is reported once and skipped: the program then meets
    DirectML's own behaviour for that operator, as without dmlpatch.
    """
    from dmlpatch import log

    if backend == "sim":
        from dmlpatch import sim

        detail: Optional[str] = sim.profile()
    else:
        from dmlpatch._metadata import version_of

        detail = version_of("torch-directml")
    try:
        return install(backend, detail)
    except RuntimeError as error:
        log.warn_once("opfix", f"operator fixes not installed: {error}")
        return None


def fix_installed(name: str) -> bool:
    """Whether the fix ``name`` (``precision.autocast``) has kernels registered now."""
    return bool(_libraries.get(name))


def installed() -> Optional[Installed]:
    """What :func:`install` registered in this process, or None."""
    return _installed


def uninstall() -> None:
    """Remove every registered kernel: DirectML's own kernels serve the operators again."""
    global _library, _installed
    from dmlpatch import changes
    from dmlpatch.opfix import (
        device_module,
        module_moves,
        sentinels,
        shared_modules,
        sharing,
        triggers,
    )
    from dmlpatch.opfix.tensors import allocation

    changes.forget(__name__)
    with _lock:
        shared_modules.uninstall()
        module_moves.uninstall()
        sharing.uninstall()
        device_module.uninstall()
        if _library is not None:
            _library._destroy()
        for libraries in _libraries.values():
            for library in libraries:
                library._destroy()
        _libraries.clear()
        _triggered.clear()
        triggers.reset()
        sentinels.uninstall()
        _library = None
        _installed = None
        allocation.uninstall_load_hook()
        for fix in registry.fixes():
            if fix.reset is not None:
                fix.reset()
