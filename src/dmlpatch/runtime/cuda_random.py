"""``torch.cuda``'s random-number functions on DirectML: the CPU's default generator.

torch-directml's kernels draw from the CPU generator (so do the simulated device's), so the
program's CUDA seeds and states are that generator's; a CUDA generator's state from a
checkpoint is left alone, said once.
"""

from __future__ import annotations

from typing import Any

from dmlpatch import log
from dmlpatch.devices import resolution as _resolution
from dmlpatch.runtime.cuda_target import adapter as _adapter
from dmlpatch.runtime.cuda_target import target as _target
from dmlpatch.runtime.cuda_target import torch_cuda as _cuda


def _generator() -> Any:
    """The generator the DirectML device draws from: the CPU's default generator (so do
    torch-directml's kernels, and the simulated device's)."""
    import torch

    return torch.default_generator


def get_rng_state(device: Any = "cuda") -> Any:
    if _target() is None:
        return _cuda("get_rng_state")(device)
    _adapter(device)
    return _generator().get_state()


def get_rng_state_all() -> list[Any]:
    if _target() is None:
        return list(_cuda("get_rng_state_all")())
    return [_generator().get_state() for _ in _resolution.current().indices]


def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
    if _target() is None:
        _cuda("set_rng_state")(new_state, device)
        return
    _adapter(device)
    generator = _generator()
    expected = generator.get_state().numel()
    if new_state.numel() != expected:
        # A CUDA generator's state (a checkpoint written on a GPU): plain python without CUDA
        # never restores it, so neither does the device; one line says so.
        log.warn_once(
            "rng_state",
            f"torch.cuda.set_rng_state was given a CUDA generator's state ({new_state.numel()} "
            f"bytes); DirectML draws from the CPU generator ({expected} bytes), which keeps "
            "its state",
        )
        return
    generator.set_state(new_state.clone())


def set_rng_state_all(new_states: Any) -> None:
    if _target() is None:
        _cuda("set_rng_state_all")(new_states)
        return
    for ordinal, state in enumerate(new_states):
        set_rng_state(state, ordinal)


def manual_seed(seed: int) -> None:
    if _target() is None:
        _cuda("manual_seed")(seed)
        return
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    if _target() is None:
        _cuda("manual_seed_all")(seed)
        return
    _generator().manual_seed(int(seed))


def seed() -> None:
    if _target() is None:
        _cuda("seed")()
        return
    _generator().seed()


def seed_all() -> None:
    if _target() is None:
        _cuda("seed_all")()
        return
    _generator().seed()


def initial_seed() -> int:
    if _target() is None:
        return int(_cuda("initial_seed")())
    return int(_generator().initial_seed())


class _Random:
    """``torch.cuda.random``: the RNG family above, by its submodule's name."""

    get_rng_state = staticmethod(get_rng_state)
    get_rng_state_all = staticmethod(get_rng_state_all)
    set_rng_state = staticmethod(set_rng_state)
    set_rng_state_all = staticmethod(set_rng_state_all)
    manual_seed = staticmethod(manual_seed)
    manual_seed_all = staticmethod(manual_seed_all)
    seed = staticmethod(seed)
    seed_all = staticmethod(seed_all)
    initial_seed = staticmethod(initial_seed)

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cuda.random, name)


random = _Random()


def generators_per_adapter() -> tuple[Any, ...]:
    """``torch.cuda.default_generators``: the device's generator for each mapped adapter."""
    return tuple(_generator() for _ in _resolution.current().indices)
