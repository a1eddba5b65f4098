"""Running a program with patches active: the one path ``python -m dmlpatch``, ``dmlpatch run``
and ``dmlpatch check`` share.

dmlpatch's own options are read up to the program (everything after belongs to it); what can be
checked without torch is checked first (one-line errors before the program starts); then patches
go in, children are set to start patched, and the device is resolved when the program first
imports torch.
"""

from __future__ import annotations

import atexit
import os
import sys

from dmlpatch import log
from dmlpatch.errors import DmlpatchError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

    from dmlpatch.devices.resolution import Resolution

CHILD_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child")


class Options:
    """dmlpatch's own command-line options (a plain class: dataclasses costs ~6 ms to import)."""

    def __init__(self) -> None:
        self.device: Optional[str] = None
        self.scope: Optional[str] = None
        self.bf16: Optional[str] = None
        self.report: Optional[str] = None
        self.verbose = False
        self.module: Optional[str] = None
        self.rest: list[str] = []


def parse_options(argv: list[str], allow_module: bool = True) -> Options:
    """dmlpatch's own options up to the program; everything after belongs to the program."""
    options = Options()
    index = 0
    while index < len(argv):
        argument = argv[index]
        if argument == "--":
            index += 1
            break
        if argument in ("--device", "-d"):
            if index + 1 >= len(argv):
                raise UsageError(f"{argument} needs a value, e.g. {argument} sim")
            options.device = argv[index + 1]
            index += 2
        elif argument.startswith("--device="):
            options.device = argument.split("=", 1)[1]
            index += 1
        elif argument == "--scope":
            if index + 1 >= len(argv):
                raise UsageError("--scope needs a value: all, project or specs")
            options.scope = parse_scope(argv[index + 1])
            index += 2
        elif argument.startswith("--scope="):
            options.scope = parse_scope(argument.split("=", 1)[1])
            index += 1
        elif argument == "--bf16" or argument.startswith("--bf16="):
            if argument == "--bf16" and index + 1 >= len(argv):
                raise UsageError("--bf16 needs a value: float32 or float16")
            value = argv[index + 1] if argument == "--bf16" else argument.split("=", 1)[1]
            options.bf16 = parse_bf16(value)
            index += 2 if argument == "--bf16" else 1
        elif argument == "--report":
            options.report = "-"
            index += 1
        elif argument.startswith("--report="):
            options.report = argument.split("=", 1)[1] or "-"
            index += 1
        elif argument in ("-v", "--verbose"):
            options.verbose = True
            index += 1
        elif argument == "-m" and allow_module:
            if index + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            options.module = argv[index + 1]
            index += 2
            break
        elif argument.startswith("-m") and len(argument) > 2 and allow_module:
            options.module = argument[2:]
            index += 1
            break
        elif argument.startswith("-") and argument != "-":
            raise UsageError(f"unknown option {argument!r}; see dmlpatch --help")
        else:
            break
    options.rest = argv[index:]
    if options.device is not None:
        from dmlpatch.devices import resolution

        resolution.parse(options.device)  # named before the script: it was given first
    return options


def parse_scope(text: str) -> str:
    from dmlpatch.rewriting import discovery

    return discovery.parse_scope(text)


def parse_bf16(text: str) -> str:
    from dmlpatch.opfix import dtype_policy

    return dtype_policy.parse_bf16(text, "--bf16 ")


def prepare(options: Options) -> bool:
    """Check what can be checked without torch (one-line errors, before the program starts),
    then patch; the device is resolved when the program first imports torch.

    Returns whether patches are active.
    """
    from dmlpatch.devices import resolution
    from dmlpatch.patching import engine
    from dmlpatch.rewriting import discovery, hook

    if options.verbose:
        os.environ["DMLPATCH_VERBOSE"] = "1"
    from dmlpatch.opfix import dtype_policy

    if options.bf16:
        os.environ[dtype_policy.BF16_ENV] = options.bf16  # children too
    dtype_policy.parse_bf16(os.environ.get(dtype_policy.BF16_ENV))  # a bad one is exit 2
    if engine.disabled():
        log.say(f"{engine.DISABLE_VAR}=1: running the program without patches")
        return False
    spec = options.device or resolution.configured_spec()
    scope_text = options.scope or os.environ.get(discovery.SCOPE_VAR)
    scope = parse_scope(scope_text) if scope_text else None  # a bad one is exit 2, before anything
    resolution.configure(spec)
    resolution.precheck()
    propagate_to_children(spec)
    engine.install(spec, scope)  # a malformed patch spec stops here, before anything is said
    resolution.when_resolved(_resolved)
    hook.when_imported("torch", _resolve_at_torch_import)
    return True


def _resolve_at_torch_import(torch: object) -> None:
    """The program imported torch: resolve now, or stop with the error's one line and code."""
    from dmlpatch.devices import resolution

    if resolution.resolving():
        return  # that resolution imported torch; it finishes (or fails) on its own
    try:
        resolution.current()
    except DmlpatchError as error:
        log.say(f"error: {error}")
        raise SystemExit(error.exit_code) from None


def _resolved(chosen: Resolution) -> None:
    from dmlpatch.devices import announce
    from dmlpatch.patching import engine

    if not chosen.patches_needed:
        engine.uninstall()  # modules rewritten so far pass each call through to CUDA
    if "LOCAL_RANK" not in os.environ:  # a torchrun worker's line is said by rank 0's start-up
        announce.resolved(chosen)


def propagate_to_children(spec: str) -> None:
    """Children (subprocess, spawn workers, DDP ranks) start patched through sitecustomize."""
    from dmlpatch.devices import announce, resolution

    os.environ[resolution.ENV_VAR] = spec
    os.environ[announce.RANK_ZERO_VAR] = "1"
    paths = os.environ.get("PYTHONPATH", "")
    if CHILD_DIRECTORY not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (CHILD_DIRECTORY, paths) if p)


def run_program(options: Options, console_script: bool) -> int:
    from dmlpatch import report
    from dmlpatch.startup import runner

    destination = options.report or os.environ.pop(report.REPORT_VAR, None)
    if destination:
        report.check_destination(destination)
        if report.per_process(destination):
            # Children (DDP ranks, workers) write theirs; they may start in another directory.
            os.environ[report.REPORT_VAR] = os.path.abspath(destination)
    if console_script:
        runner.find_console_script(options.rest[0])
    elif options.module is not None:
        runner.check_module(options.module)
    else:
        runner.check_path(options.rest[0])
    active = prepare(options)
    if destination:
        atexit.register(report.write, destination)
    program_file: Optional[str] = None
    try:
        if console_script:
            result = runner.run_console_script(options.rest[0], options.rest[1:])
            return runner.exit_status(result)
        if options.module is not None:
            runner.run_module(options.module, options.rest, rewrite=active)
        else:
            program_file = os.path.abspath(options.rest[0])
            runner.run_path(options.rest[0], options.rest[1:], rewrite=active)
    except SystemExit:
        raise
    except UsageError:
        raise
    except BaseException as error:
        if isinstance(error, DmlpatchError):
            if log.debug_enabled():
                import traceback

                traceback.print_exc()
            log.say(f"error: {error}")
            return error.exit_code
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        trimmed = runner.program_traceback(error, program_file or main_file)
        # Chained exceptions are printed from __traceback__, so trim it on the exception too.
        sys.excepthook(type(error), error.with_traceback(trimmed), trimmed)
        if isinstance(error, KeyboardInterrupt):
            # Python ends an interrupted program by SIGINT (130 in a shell; Windows' own code
            # there) once it has shut down: the interpreter does that for an uncaught
            # KeyboardInterrupt, so it gets this one, without printing it a second time.
            sys.excepthook = _printed_already
            raise
        return 1
    return 0


def _printed_already(*exc_info: object) -> None:
    """The excepthook for the KeyboardInterrupt whose trimmed traceback was printed."""
