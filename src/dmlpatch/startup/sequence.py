"""The one start-up sequence: every way into a patched process calls :func:`start`.

A process becomes patched through the runner and ``dmlpatch check`` (``launch``), an activated
environment's ``.pth`` and the runner's children (``bootstrap``), ``import dmlpatch.auto`` and
``dmlpatch.patch()``. Whichever it was, the process then has the same things (coverage.py's
``process_startup`` is the model):

- the specs' patches and discovery (``specs.engine``): the import hook and the wrappers;
- the device resolved before the first backward pass (``first_backward``), and the patches taken
  out again where it turns out to be a usable CUDA GPU;
- multiprocessing spawn children that rewrite the main script as the parent did (``spawn_main``);
- ``$DMLPATCH_REPORT`` written at exit once the program used a device.

What the caller asked for is said in the arguments: ``strict`` (a bad setting is the caller's
:class:`~dmlpatch.errors.DmlpatchError`; otherwise one warning and nothing installed, since an
activated environment must never stop a program from starting), ``eager`` (the runner: resolve
when the program imports torch, so that an explicit device that cannot be met stops it there,
exit 2), ``children`` (the runner: child processes start patched through ``sitecustomize``),
``speaks`` (what says the "running on" line, and when; None where another process says it)
and ``main`` (the ``.pth``: rewrite the main script that is about to run).

:func:`start` returns a :class:`Startup` handle whose :meth:`~Startup.undo` takes out exactly
what this start-up put in (typeguard's ``install_import_hook`` returns one): the hook, the
wrappers, the callbacks, the exit handler and the environment it gave children. A process starts
once; calling :func:`start` again returns the handle in force.
"""

from __future__ import annotations

import atexit
import os

from dmlpatch import log
from dmlpatch.environment_variables import (
    DMLPATCH_ANNOUNCE_RANK_ZERO,
    DMLPATCH_DEVICE,
    DMLPATCH_REPORT,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType, TracebackType
    from typing import Callable, Optional

    from dmlpatch.devices.resolution import Resolution

CHILD_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child")


class Startup:
    """What one start-up installed in this process; :meth:`undo` takes it out again.

    True when patches are active. Also a context manager: ``with dmlpatch.patch("sim"): ...``.
    """

    def __init__(self, active: bool) -> None:
        self.active = active
        self._steps = 0

    def __bool__(self) -> bool:
        return self.active

    def __repr__(self) -> str:
        return f"<dmlpatch start-up: {'active' if self.active else 'inactive'}>"

    def __enter__(self) -> Startup:
        return self

    def __exit__(
        self,
        kind: Optional[type[BaseException]],
        value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.undo()

    def on_undo(self, step: Callable[[], None], what: str = "", kind: str = "callback") -> None:
        """Record in the process's ledger (:mod:`dmlpatch.changes`) what undoes a piece of
        this start-up."""
        from dmlpatch import changes

        self._steps += 1
        changes.record(f"start-up:{self._steps}", kind, what or _name_of(step), step)

    def undo(self) -> None:
        """Take out everything dmlpatch installed in this process, last first (the ledger:
        this start-up's pieces and what committing to a device installed); what cannot be
        undone is said in one line. Modules already imported stay as they were loaded
        (rewritten or not)."""
        global _current
        undo_everything()
        self.active = False
        if _current is self:
            _current = None


def undo_everything() -> None:
    """Drain the process's ledger of changes, last first; say in one line what stays."""
    from dmlpatch import changes

    kept = changes.undo()
    if kept:
        log.say(
            "could not undo: " + "; ".join(f"{change.what} ({change.why_not})" for change in kept)
        )


def _name_of(step: Callable[..., object]) -> str:
    module = getattr(step, "__module__", "") or ""
    return f"{module}.{getattr(step, '__qualname__', 'step')}".lstrip(".")


_current: Optional[Startup] = None


def current() -> Optional[Startup]:
    """The start-up in force in this process, or None."""
    return _current


def start(
    device: Optional[str] = None,
    scope: Optional[str] = None,
    *,
    strict: bool = True,
    eager: bool = False,
    children: bool = False,
    speaks: Optional[Callable[[Resolution], None]] = None,
    main: bool = False,
    report: Optional[str] = None,
) -> Startup:
    """Patch this process; see the module's docstring for what the arguments ask for.

    ``device`` None: ``$DMLPATCH_DEVICE``, else ``auto``. ``report``: a report to write at
    exit whatever happens (the runner's ``--report``); without it, ``$DMLPATCH_REPORT`` is
    written at exit when the program used a device. Returns the handle (False when
    ``DMLPATCH_DISABLE=1``, or, not ``strict``, when a setting is wrong: one warning says so).
    """
    global _current
    if _current is not None:
        return _current
    from dmlpatch.devices import resolution
    from dmlpatch.errors import DmlpatchError
    from dmlpatch.specs import engine

    if engine.disabled():
        return Startup(False)
    handle = Startup(True)
    from dmlpatch.startup import commitment

    commitment.register()
    handle.on_undo(
        lambda: resolution.forget_on_commit(commitment.install_op_fixes),
        "the operator fixes installed when the process commits to DirectML",
    )
    spec = device or resolution.configured_spec()
    try:
        if strict:
            resolution.configure(spec)
            resolution.precheck()  # one-line errors before the program starts
        if children:
            _propagate_to_children(handle, spec)
        engine.install(spec, scope)  # a malformed patch spec stops here, before anything is said
    except DmlpatchError as error:
        handle.undo()
        if strict:
            raise
        log.say(f"warning: patches not active in this process: {error}")
        # Said once: site.py may read the same .pth twice (a venv's lib64 -> lib link).
        _current = Startup(False)
        return _current
    handle.on_undo(engine.uninstall, "patch specs and discovery: their import hook", "import hook")
    _current = handle
    _on_resolution(handle, _patches_not_needed)
    if speaks is not None:
        _on_resolution(handle, speaks)
    _when_imported(handle, "torch", _first_backward)
    if eager:
        _when_imported(handle, "torch", _resolve_at_torch_import)
    from dmlpatch.startup import spawn_main

    spawn_main.install()
    handle.on_undo(spawn_main.uninstall, "spawn children rewrite the main script as this process")
    writer: Optional[Callable[[str], None]] = None
    if report:
        from dmlpatch import report as reports

        writer = reports.write
    elif os.environ.get(DMLPATCH_REPORT):
        report, writer = os.environ[DMLPATCH_REPORT], _write_report_if_used
    if report and writer is not None:
        from dmlpatch.placement_page.destination import is_page

        if is_page(report):
            from dmlpatch.placement import session

            session.keep_lines()
        atexit.register(writer, report)
        handle.on_undo(
            lambda: atexit.unregister(writer),
            f"the run report, written at exit to {report}",
            "exit handler",
        )
    if main:
        from dmlpatch.startup import main_script

        handle.on_undo(main_script.arm_for_activation(), "the main script rewritten as it runs")
    return handle


def _on_resolution(handle: Startup, listener: Callable[[Resolution], None]) -> None:
    from dmlpatch.devices import resolution

    resolution.when_resolved(listener)
    handle.on_undo(
        lambda: resolution.forget_when_resolved(listener),
        f"{_name_of(listener)}, called once the device is resolved",
    )


def _when_imported(handle: Startup, module: str, callback: Callable[[ModuleType], None]) -> None:
    from dmlpatch.rewriting import hook

    hook.when_imported(module, callback)
    handle.on_undo(
        lambda: hook.forget_when_imported(module, callback),
        f"{_name_of(callback)}, called when {module} is imported",
    )


def _patches_not_needed(chosen: Resolution) -> None:
    """A usable CUDA GPU: modules rewritten so far pass each call through to CUDA."""
    if not chosen.patches_needed:
        from dmlpatch.specs import engine

        engine.uninstall()


def _first_backward(torch: ModuleType) -> None:
    from dmlpatch.startup import first_backward

    first_backward.arm(torch)
    if _current is not None:
        _current.on_undo(first_backward.disarm, "the device resolved before the first backward")


def _resolve_at_torch_import(torch: object) -> None:
    """The program imported torch: resolve now, or stop with the error's one line and code."""
    from dmlpatch.devices import resolution
    from dmlpatch.errors import DmlpatchError

    if resolution.resolving():
        return  # that resolution imported torch; it finishes (or fails) on its own
    try:
        resolution.current()
    except DmlpatchError as error:
        log.say(f"error: {error}")
        raise SystemExit(error.exit_code) from None


def _propagate_to_children(handle: Startup, spec: str) -> None:
    """Children (subprocess, spawn workers, DDP ranks) start patched through sitecustomize."""

    saved = {name: os.environ.get(name) for name in (DMLPATCH_DEVICE, DMLPATCH_ANNOUNCE_RANK_ZERO)}
    saved["PYTHONPATH"] = os.environ.get("PYTHONPATH")
    handle.on_undo(
        lambda: _restore(saved),
        f"{DMLPATCH_DEVICE}, {DMLPATCH_ANNOUNCE_RANK_ZERO} and PYTHONPATH for child processes",
        "environment",
    )
    os.environ[DMLPATCH_DEVICE] = spec
    os.environ[DMLPATCH_ANNOUNCE_RANK_ZERO] = "1"
    paths = os.environ.get("PYTHONPATH", "")
    if CHILD_DIRECTORY not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (CHILD_DIRECTORY, paths) if p)


def _restore(saved: dict[str, Optional[str]]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _write_report_if_used(destination: str) -> None:
    # Every Python process of an activated environment runs this; only those that touched a
    # device (pip, say, never does) have anything to report.
    from dmlpatch import report
    from dmlpatch.devices import resolution

    if resolution.resolved_or_none() is not None:
        report.write(destination)
