"""Loading the simulated device into this process (once): checks, build, configuration."""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading
from typing import Any

from dmlpatch.environment_variables import (
    DMLPATCH_DEBUG,
    DMLPATCH_SIM_DEVICES,
    DMLPATCH_SIM_FAULT,
    DMLPATCH_SIM_FLOAT64,
)
from dmlpatch.errors import DeviceUnavailable
from dmlpatch.gaps import profiles
from dmlpatch.sim import _state

FAULTS = ("drop-scalar-writes",)

_lock = threading.Lock()


class _TorchDirectmlBlocker(importlib.abc.MetaPathFinder):
    """Once the simulator owns PrivateUse1, importing torch_directml fails with one line."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "torch_directml":
            raise ImportError(
                "torch_directml cannot be imported: the simulated DirectML device (dmlpatch "
                "--device sim) already owns the PrivateUse1 backend in this process"
            )


def env_settings() -> tuple[int, bool, str]:
    """Adapters, float64 support and fault from the environment; checked without torch."""
    # Named adapters (DMLPATCH_SIM_ADAPTERS) are that many, unless DMLPATCH_SIM_DEVICES says.
    raw = os.environ.get(DMLPATCH_SIM_DEVICES) or str(max(1, len(_state.named())))
    try:
        devices = int(raw)
    except ValueError:
        devices = 0
    if devices < 1:
        raise DeviceUnavailable(f"{DMLPATCH_SIM_DEVICES} must be a whole number >= 1, got {raw!r}")
    fault = os.environ.get(DMLPATCH_SIM_FAULT, "")
    if fault and fault not in FAULTS:
        raise DeviceUnavailable(
            f"unknown {DMLPATCH_SIM_FAULT} {fault!r}; valid values: {', '.join(FAULTS)}"
        )
    float64 = os.environ.get(DMLPATCH_SIM_FLOAT64, "1") != "0"
    return devices, float64, fault


def _check_backend_free() -> None:
    if "torch_directml" in sys.modules:
        raise DeviceUnavailable(
            "torch_directml is already imported: it and the simulated device cannot share the "
            "PrivateUse1 backend in one process (use --device dml, or do not import it)"
        )
    import torch

    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuse1", "privateuseone"):
        raise DeviceUnavailable(
            f"the PrivateUse1 backend is already named {name!r} in this process; "
            "the simulated device needs it as 'privateuseone'"
        )
    if hasattr(torch, "privateuseone"):
        raise DeviceUnavailable(
            "another PrivateUse1 device module is already registered in this process"
        )


def load(profile: str | None = None) -> None:
    """See :func:`dmlpatch.sim.load`."""
    chosen = profiles.resolve(profile)
    with _lock:
        if _state.CURRENT is not None:
            if chosen.name != _state.CURRENT.profile:
                raise DeviceUnavailable(
                    f"the simulated device is already loaded with profile "
                    f"{_state.CURRENT.profile!r}; profiles cannot change within a process"
                )
            return
        devices, float64, fault = env_settings()
        from dmlpatch.sim.counting import trace_requested

        trace = trace_requested()
        _check_backend_free()
        _load(chosen, devices, float64, trace, fault)


def _load(chosen: profiles.Profile, devices: int, float64: bool, trace: bool, fault: str) -> None:
    import torch

    from dmlpatch.gaps import registered_ops
    from dmlpatch.sim import autograd_exit, build, counting, device_module, rnn

    path = build.ensure_built()
    torch.ops.load_library(str(path))
    # at::getAccelerator() only sees PrivateUse1 once the backend is named (autograd needs it).
    torch.utils.rename_privateuse1_backend("privateuseone")
    counting.install_hook()  # before any operator can reach the fallback
    ops = torch.ops.dmlpatch_sim
    ops.configure(devices, float64, trace, fault)

    index = registered_ops.load_index(path.parent)
    native = registered_ops.native_set(registered_ops.listed_ops(), index)
    default_class = 1 if chosen.has_gaps else 0
    ops.set_classes(
        default_class,
        "\n".join("aten::" + n for n in sorted(native)),
        "\n".join(registered_ops.HOST_TENSORS_OK),
    )
    if chosen.refuses_inference_mode:
        ops.refuse_inference_mode(profiles.INFERENCE_MODE_TEXT)
    if chosen.drops_out_resizes:
        ops.drop_out_resizes("\n".join(chosen.drops_out_resizes))
    ops.set_quirks("\n".join(chosen.quirks), "\n".join(chosen.unsupported_dtypes))
    for rule in chosen.rules:
        ops.add_rule(rule.op, rule.predicate, ",".join(rule.args), rule.limit, rule.message)
    direct = registered_ops.direct_registrations(index, {r.op for r in chosen.rules}, native)
    failed = ops.register_direct("".join(f"{k}\t{v}\n" for k, v in sorted(direct.items())))
    if failed and os.environ.get(DMLPATCH_DEBUG) == "1":
        print(f"dmlpatch: sim kernels not registered: {failed.split()}", file=sys.stderr)

    device_module.install()
    autograd_exit.install()
    from dmlpatch.costs import simulated

    simulated.configure(_state.device_name(0, devices))
    if chosen.fused_rnn_cells:
        rnn.install()
    sys.meta_path.insert(0, _TorchDirectmlBlocker())
    _state.CURRENT = _state.Loaded(chosen.name, devices, float64, trace)
    from dmlpatch import changes

    changes.record(
        "dmlpatch.sim",
        "device",
        f"the simulated DirectML device, profile {chosen.name}: the privateuseone backend, its "
        "device module and kernels, and the import hook that keeps torch_directml out",
        None,
        "torch keeps a backend and its device module for the life of the process",
    )
