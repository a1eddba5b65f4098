"""What an adapter's allocator holds now, and the most it held since its peak was last reset:
the figures behind ``torch.cuda.memory_allocated`` and ``max_memory_allocated``.

On the simulated device both are the allocator's own, counted at every allocation and free
(:func:`dmlpatch.sim.memory_allocated`, :func:`dmlpatch.sim.max_memory_allocated`), so the peak
is the true one whenever it happened. torch-directml's allocator keeps no peak and has no hook
for dmlpatch, so on DirectML the peak is the highest of what its ``gpu_memory`` reported at the
moments dmlpatch reads it: each of the program's memory queries and the end of each optimizer
step (one ``gpu_memory`` call per step and adapter, none per operator). What is held between two
such moments only (activations freed during the backward pass) goes unseen: there the peak is a
lower bound of the true one.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

_lock = threading.Lock()
#: The highest ``gpu_memory`` reading per (backend, adapter) since its peak was last reset.
_sampled: dict[tuple[str, int], int] = {}
_step_hook: Optional[Any] = None


def _simulated(backend: str, index: int) -> bool:
    """Whether the simulated allocator counts adapter ``index`` (else its figures are read
    like DirectML's, through ``gpu_memory``, which answers 0 for an adapter it lacks)."""
    if backend != "sim":
        return False
    from dmlpatch import sim

    return 0 <= index < sim.device_count()


def in_use(backend: str, index: int) -> int:
    """Bytes adapter ``index``'s allocator holds now (a reading that counts toward the peak on
    DirectML)."""
    if _simulated(backend, index):
        from dmlpatch import sim

        return sim.memory_allocated(index)
    return sample(backend, index)


def peak(backend: str, index: int) -> int:
    """The most bytes adapter ``index``'s allocator held since its peak was last reset: the true
    peak on the simulated device, the highest reading on DirectML."""
    if _simulated(backend, index):
        from dmlpatch import sim

        return sim.max_memory_allocated(index)
    return sampled_peak(backend, index)


def reset_peak(backend: str, index: int) -> None:
    """Start the peak again from what the allocator holds now."""
    if _simulated(backend, index):
        from dmlpatch import sim

        sim.reset_peak_memory(index)
        return
    reset_sampled_peak(backend, index)


def sample(backend: str, index: int) -> int:
    """Read what ``backend``'s ``gpu_memory`` says adapter ``index`` holds, and keep it as the
    sampled peak when it is the highest since the last reset."""
    from dmlpatch.devices import adapters

    used = adapters.memory_in_use(backend, index)
    with _lock:
        key = (backend, index)
        _sampled[key] = max(_sampled.get(key, 0), used)
    return used


def sampled_peak(backend: str, index: int) -> int:
    """The highest ``gpu_memory`` reading of adapter ``index`` since the last reset, now's
    included."""
    used = sample(backend, index)
    with _lock:
        return _sampled.get((backend, index), used)


def reset_sampled_peak(backend: str, index: int) -> None:
    """Start the sampled peak again from what ``gpu_memory`` reports now."""
    with _lock:
        _sampled.pop((backend, index), None)
    sample(backend, index)


def sample_at_steps(backend: str, indices: tuple[int, ...]) -> None:
    """Sample the adapters ``indices`` at the end of every optimizer step from now on (once per
    process; undone with dmlpatch's other changes)."""
    global _step_hook
    with _lock:
        if _step_hook is not None:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
            for index in indices:
                sample(backend, index)

        _step_hook = register_optimizer_step_post_hook(stepped)
    from dmlpatch import changes

    changes.record(
        "dmlpatch.runtime.memory_peaks",
        "callback",
        "an optimizer step hook (torch.cuda's peak memory reads DirectML's allocator once a step)",
        _stop_sampling,
    )


def _stop_sampling() -> None:
    global _step_hook
    with _lock:
        if _step_hook is not None:
            _step_hook.remove()
            _step_hook = None
