"""What committing a process to a device sets in motion: DirectML's operator gaps fixed on the
device (:mod:`dmlpatch.opfix`, with PyTorch's own ``PrivateUse1`` gaps: module moves, sharing,
the device module). Resolution only answers (:mod:`dmlpatch.devices.resolution`); start-up and
the public API that resolves (:func:`dmlpatch.device`) register this hook with it, so that the
device package never imports the fixes and the fixes may import the device package."""

from __future__ import annotations

from dmlpatch.devices import resolution

TYPE_CHECKING = False
if TYPE_CHECKING:
    from dmlpatch.devices.resolution import Resolution


def install_op_fixes(chosen: Resolution) -> None:
    """The operator fixes of a DirectML backend (real or simulated); nothing for the others.

    On real DirectML also the reading of its allocator at each optimizer step, which is what
    torch.cuda's peak memory can see there (:mod:`dmlpatch.runtime.memory_peaks`; the simulated
    allocator counts its own)."""
    if chosen.backend in ("sim", "directml"):
        from dmlpatch import opfix  # imports torch: only once the process commits to DirectML

        opfix.install_for(chosen.backend)
    if chosen.backend == "directml":
        from dmlpatch.runtime import memory_peaks

        memory_peaks.sample_at_steps(chosen.backend, chosen.indices)


def register() -> None:
    """Install the fixes whenever this process commits to DirectML (now, if it has)."""
    resolution.on_commit(install_op_fixes)
