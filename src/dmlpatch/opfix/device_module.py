"""What torch asks of the device's module (``torch.privateuseone``) and torch-directml lacks.

torch-directml registers its ``PrivateUse1Module`` as the device module with ``is_available``,
``device_count``, ``device``, the autocast queries, ``manual_seed_all`` and little else. Torch's
own code asks an accelerator's module for more, as it asks ``torch.cuda``:

- ``torch.random.fork_rng(device_type=...)``, ``torch.utils.checkpoint`` (whose default keeps
  the RNG state of every device an input is on), ``torch.testing``'s ``freeze_rng_state`` on
  torch >= 2.6, AOTAutograd's RNG functionalisation: ``get_rng_state`` / ``set_rng_state``,
  ``default_generators``, ``_get_generator``;
- ``torch._utils._get_device_index`` behind ``torch.load(f, "cuda")``, ``DataParallel`` and
  ``torch.cuda._utils``: ``current_device``; torch 2.4's ``DataLoader`` pinning thread:
  ``set_device``;
- the autograd profiler: ``synchronize``; ``torch.accelerator``'s lazy seeding: ``_lazy_call``.

Without them each stops with ``AttributeError: type object 'PrivateUse1Module' has no attribute
'get_rng_state'`` (the simulated device's module is ``SimModule``, reproducing the gap). This
module adds each missing one to whatever module is registered, answered as DirectML works: the
device draws its random numbers from the CPU's default generator (so do torch-directml's
kernels and the simulated device's), so its RNG state is that generator's; its adapters have one
queue each, drained by a read from the device; the current device is the module's default
adapter. Names the module already has are left as they are; :func:`uninstall` removes what
:func:`install` added.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from dmlpatch import changes

_lock = threading.Lock()
#: The module the names were added to, and the names added.
_added: list[tuple[Any, str]] = []


def _generator() -> Any:
    import torch

    return torch.default_generator


def _module() -> Any:
    import torch

    return getattr(torch, "privateuseone", None)


def current_device() -> int:
    """The adapter ``privateuseone`` without an index means: the module's default one."""
    module = _module()
    default = getattr(module, "default_device", None)
    return int(default()) if callable(default) else 0


def set_device(device: Any) -> None:
    """DirectML has no current device to switch: every tensor names its adapter. (torch 2.4's
    pinning thread calls it for a ``DataLoader(pin_memory_device="privateuseone")``.)"""


def get_rng_state(device: Any = None) -> Any:
    return _generator().get_state()


def set_rng_state(new_state: Any, device: Any = None) -> None:
    _generator().set_state(new_state)


def get_rng_state_all() -> list[Any]:
    module = _module()
    count = int(module.device_count()) if module is not None else 1
    return [_generator().get_state() for _ in range(count)]


def set_rng_state_all(new_states: Any) -> None:
    # One generator serves every adapter: the states are all the same one's.
    for state in new_states:
        _generator().set_state(state)


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def initial_seed() -> int:
    return int(_generator().initial_seed())


def _get_generator(device: Any = None) -> Any:
    return _generator()


def synchronize(device: Any = None) -> None:
    """Wait for the adapter's queue: a read from the device drains it (DirectML has no
    synchronize of its own)."""
    import torch

    index = device if isinstance(device, int) else getattr(device, "index", None)
    if isinstance(device, str):
        index = torch.device(device).index
    target = torch.device("privateuseone", index if index is not None else current_device())
    torch.zeros(1, device=target).cpu()


def is_initialized() -> bool:
    return True


def _lazy_call(callable: Callable[[], Any], **kwargs: Any) -> None:
    """Seeding and other set-up torch defers until CUDA starts: DirectML is started."""
    callable()


#: What is added, by name: functions (static methods on a module that is a class).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "current_device": current_device,
    "set_device": set_device,
    "get_rng_state": get_rng_state,
    "set_rng_state": set_rng_state,
    "get_rng_state_all": get_rng_state_all,
    "set_rng_state_all": set_rng_state_all,
    "manual_seed": manual_seed,
    "seed": seed,
    "initial_seed": initial_seed,
    "_get_generator": _get_generator,
    "synchronize": synchronize,
    "is_initialized": is_initialized,
    "_lazy_call": _lazy_call,
}


def install() -> tuple[str, ...]:
    """Add the missing names to the registered device module; idempotent. Returns what was
    added (nothing where no module is registered)."""
    module = _module()
    if module is None:
        return ()
    with _lock:
        if _added:
            return tuple(name for _, name in _added)
        for name, function in FUNCTIONS.items():
            if hasattr(module, name):
                continue
            value: Any = staticmethod(function) if isinstance(module, type) else function
            setattr(module, name, value)
            _added.append((module, name))
        if not hasattr(module, "default_generators"):
            count = int(module.device_count()) if hasattr(module, "device_count") else 1
            module.default_generators = tuple(_generator() for _ in range(count))
            _added.append((module, "default_generators"))
        added = tuple(name for _, name in _added)
        if added:
            changes.record(
                __name__,
                "function",
                f"{len(added)} functions of the device's module (torch.{module.__name__})",
                uninstall,
            )
        return added


def uninstall() -> None:
    with _lock:
        changes.forget(__name__)
        for module, name in reversed(_added):
            delattr(module, name)
        _added.clear()
