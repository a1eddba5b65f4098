"""dmlpatch: run CUDA-only PyTorch programs and libraries on DirectML, unmodified.

``import dmlpatch`` is cheap: it imports neither torch, torch-directml nor any target library.

The public API is this package's functions (:func:`patch`, :func:`unpatch`, :func:`device`,
:func:`describe`), ``dmlpatch.auto``, ``dmlpatch.sim`` (the simulated DirectML device),
``dmlpatch.errors``, the ``dmlpatch`` command and the pytest plugin; a patch pack's fixes are
called as ``fix(wrapped, instance, args, kwargs)`` and need no dmlpatch module
(``dmlpatch/patches/README.md``). Every other module is internal: its name and contents may
change in any release. They are not underscored because two of them are named in the ``.pth``
lines of environments already activated (``dmlpatch.startup.bootstrap``,
``dmlpatch.pinning.pip_refusal``), and one layout for all beats a rule with exceptions.

PYTEST_DONT_REWRITE: pytest marks the packages of its plugins (``dmlpatch.pytest_plugin``) for
assertion rewriting, and under ``python -m dmlpatch -m pytest`` this package is imported before
pytest starts; the marker keeps pytest from warning that it cannot rewrite it.
"""

from __future__ import annotations

from dmlpatch._version import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = ["__version__", "describe", "device", "patch", "unpatch"]


def device() -> Any:
    """The ``torch.device`` this process targets (resolving it on first call)."""
    from dmlpatch.devices import resolution
    from dmlpatch.startup import commitment

    commitment.register()
    return resolution.current().torch_device()


def describe() -> dict[str, Any]:
    """Backend, device, adapter name(s) and why they were chosen."""
    from dmlpatch.devices import resolution
    from dmlpatch.startup import commitment

    commitment.register()
    return resolution.current().as_dict()


def patch(device: Optional[str] = None) -> Any:
    """Patch this process (what ``import dmlpatch.auto`` does) and return the handle that
    undoes it: true while patches are active (false when ``DMLPATCH_DISABLE=1``), ``undo()``
    takes out what this call put in, and ``with dmlpatch.patch("sim"):`` does both.

    A bad ``device`` raises :class:`~dmlpatch.errors.UsageError`. Not to be confused with
    ``dmlpatch activate``, which makes every process of the environment start patched.
    """
    from dmlpatch.startup import sequence

    return sequence.start(device)


def unpatch() -> None:
    """Undo this process's start-up: the import hook, every function-level fix and what else
    it installed (the opposite of :func:`patch`)."""
    from dmlpatch.specs import engine
    from dmlpatch.startup import sequence

    started = sequence.current()
    if started is not None:
        started.undo()
    else:  # the operator fixes dmlpatch.device() installed, say
        sequence.undo_everything()
    engine.uninstall()
