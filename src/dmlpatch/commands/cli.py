"""The ``dmlpatch`` command and ``python -m dmlpatch``.

python -m dmlpatch [--device SPEC] [--scope SCOPE] [--report[=FILE]] [-v] script.py [args...]
python -m dmlpatch [options] -m module [args...]
dmlpatch run [options] COMMAND [args...]
dmlpatch activate [--device SPEC] | deactivate | status
"""

from __future__ import annotations

import atexit
import os
import sys

from dmlpatch import log
from dmlpatch._version import __version__
from dmlpatch.errors import DmlpatchError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

    from dmlpatch.device.resolution import Resolution

USAGE = """\
usage: python -m dmlpatch [--device SPEC] [--report[=FILE]] [-v] script.py [args...]
       python -m dmlpatch [options] -m module [args...]
       dmlpatch run [options] COMMAND [args...]      run a console script such as yolo
       dmlpatch check [options] script.py [args...]  would it run on DirectML? (check --help)
       dmlpatch activate [--device SPEC] [--pin]     patch every Python process of this env
       dmlpatch deactivate                           undo activate
       dmlpatch pin                                  keep torch-directml's torch in pip installs
       dmlpatch unpin                                undo pin
       dmlpatch status                               show activation and device
       dmlpatch doctor [--json]                      diagnose this environment
       dmlpatch list [--json]                        the patch catalogue vs installed libraries
       dmlpatch scan PACKAGE|PATH [--spec]           find CUDA device sites (no import)

options:
  --device SPEC     auto (default), dml, dml:N, dml:NAME, privateuseone:N, sim, cpu, cuda, ...
                    also read from $DMLPATCH_DEVICE
  --scope SCOPE     where CUDA sites are rewritten: all (default: every module but the standard
                    library and torch's own), project (the program's own modules: outside
                    site-packages), specs (the main script and the modules specs name);
                    also read from $DMLPATCH_SCOPE
  --report[=FILE]   at exit, print (or write) a JSON summary; also $DMLPATCH_REPORT=FILE
  -v, --verbose     say what is patched; DMLPATCH_DEBUG=1 also shows dmlpatch tracebacks
  --version         print dmlpatch's version

At exit, one warning line when most model compute ran on the CPU although an accelerator was
selected; DMLPATCH_QUIET=1 keeps it to itself, DMLPATCH_ACCOUNTING=0 stops the counting.
"""

COMMANDS = (
    *("run", "check", "activate", "deactivate", "status", "doctor", "list", "scan"),
    *("pin", "unpin"),
)
CHILD_DIRECTORY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "startup", "_child"
)


class Options:
    """dmlpatch's own command-line options (a plain class: dataclasses costs ~6 ms to import)."""

    def __init__(self) -> None:
        self.device: Optional[str] = None
        self.scope: Optional[str] = None
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
            options.scope = _scope(argv[index + 1])
            index += 2
        elif argument.startswith("--scope="):
            options.scope = _scope(argument.split("=", 1)[1])
            index += 1
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
        from dmlpatch.device import resolution

        resolution.parse(options.device)  # named before the script: it was given first
    return options


def _scope(text: str) -> str:
    from dmlpatch.rewriting import discovery

    return discovery.parse_scope(text)


def main(argv: Optional[list[str]] = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(arguments)
    except DmlpatchError as error:
        if log.debug_enabled():
            import traceback

            traceback.print_exc()
        log.say(f"error: {error}")
        return error.exit_code


def _dispatch(arguments: list[str]) -> int:
    if not arguments:
        raise UsageError("no script given; usage: python -m dmlpatch [options] script.py [args...]")
    if arguments[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if arguments[0] == "--version":
        sys.stdout.write(f"dmlpatch {__version__}\n")
        return 0
    command = arguments[0]
    if command in COMMANDS and command != "check":
        from dmlpatch.commands import usage

        if usage.wants_help(arguments[1:]):
            sys.stdout.write(usage.HELP[command])
            return 0
    if command in ("pin", "unpin"):
        from dmlpatch.pinning import pin as pinning

        return pinning.main(command, arguments[1:])
    if command == "activate":
        return _activate(arguments[1:])
    if command == "deactivate":
        return _deactivate(arguments[1:])
    if command == "doctor":
        return _doctor(arguments[1:])
    if command == "list":
        return _list(arguments[1:])
    if command == "scan":
        return _scan(arguments[1:])
    if command == "status":
        return _status(arguments[1:])
    if command == "check":
        from dmlpatch.commands import check

        return check.main(arguments[1:])
    if command == "run":
        options = parse_options(arguments[1:], allow_module=False)
        if not options.rest:
            raise UsageError("dmlpatch run needs a command, e.g. dmlpatch run yolo train ...")
        return _run_program(options, console_script=True)
    options = parse_options(arguments)
    if options.module is None and not options.rest:
        raise UsageError("no script given; usage: python -m dmlpatch [options] script.py [args...]")
    if options.module is None and _looks_like_command(options.rest[0]):
        raise UsageError(
            f"{options.rest[0]!r} is neither a dmlpatch command ({', '.join(COMMANDS)}) nor a "
            "file; see dmlpatch --help"
        )
    return _run_program(options, console_script=False)


def _looks_like_command(argument: str) -> bool:
    """A bare word that is no file: a mistyped command rather than a missing script."""
    return argument.isidentifier() and argument.islower() and not os.path.exists(argument)


def _prepare(options: Options) -> bool:
    """Check what can be checked without torch (one-line errors, before the program starts),
    then patch; the device is resolved when the program first imports torch.

    Returns whether patches are active.
    """
    from dmlpatch.device import resolution
    from dmlpatch.patching import engine
    from dmlpatch.rewriting import hook

    if options.verbose:
        os.environ["DMLPATCH_VERBOSE"] = "1"
    if engine.disabled():
        log.say("DMLPATCH_DISABLE=1: running the program without patches")
        return False
    spec = options.device or resolution.configured_spec()
    scope_text = options.scope or os.environ.get("DMLPATCH_SCOPE")
    scope = _scope(scope_text) if scope_text else None  # a bad one is exit 2, before anything
    resolution.configure(spec)
    resolution.precheck()
    _propagate_to_children(spec)
    engine.activate(spec, scope)  # a malformed patch spec stops here, before anything is said
    resolution.when_resolved(_resolved)
    hook.when_imported("torch", _resolve_at_torch_import)
    return True


def _resolve_at_torch_import(torch: object) -> None:
    """The program imported torch: resolve now, or stop with the error's one line and code."""
    from dmlpatch.device import resolution

    if resolution.resolving():
        return  # that resolution imported torch; it finishes (or fails) on its own
    try:
        resolution.current()
    except DmlpatchError as error:
        log.say(f"error: {error}")
        raise SystemExit(error.exit_code) from None


def _resolved(chosen: Resolution) -> None:
    from dmlpatch.device import announce
    from dmlpatch.patching import engine

    if not chosen.patches_needed:
        engine.deactivate()  # modules rewritten so far pass each call through to CUDA
    if "LOCAL_RANK" not in os.environ:  # a torchrun worker's line is said by rank 0's start-up
        announce.resolved(chosen)


def _propagate_to_children(spec: str) -> None:
    """Children (subprocess, spawn workers, DDP ranks) start patched through sitecustomize."""
    from dmlpatch.device import announce

    os.environ["DMLPATCH_DEVICE"] = spec
    os.environ[announce.RANK_ZERO_VAR] = "1"
    paths = os.environ.get("PYTHONPATH", "")
    if CHILD_DIRECTORY not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (CHILD_DIRECTORY, paths) if p)


def _run_program(options: Options, console_script: bool) -> int:
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
    active = _prepare(options)
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
        return 1
    return 0


def _activate(arguments: list[str]) -> int:
    from dmlpatch.startup import activation

    pin = "--pin" in arguments
    options = parse_options([a for a in arguments if a != "--pin"], allow_module=False)
    if options.rest:
        raise UsageError(f"activate takes only --device and --pin; unexpected {options.rest[0]!r}")
    if options.scope is not None:
        raise UsageError(
            "activate takes only --device and --pin; for a narrower scope set DMLPATCH_SCOPE "
            "in the environment the programs run in"
        )
    path, changed = activation.activate(options.device or "auto")
    state = "activated" if changed else "already activated"
    log.say(f"{state}: {path} (device {options.device or 'auto'}); undo with: dmlpatch deactivate")
    if pin:
        from dmlpatch.pinning import pin as pinning

        pinning.say_pin("activate")
    return 0


def _deactivate(arguments: list[str]) -> int:
    from dmlpatch.startup import activation

    if arguments:
        raise UsageError(f"deactivate takes no arguments; unexpected {arguments[0]!r}")
    removed = activation.deactivate()
    if removed is None:
        log.say(
            f"not activated in this environment ({activation.pth_path()} absent); nothing to do"
        )
    else:
        log.say(f"deactivated: removed {removed}")
    from dmlpatch.pinning import pin as pinning

    lifted = pinning.unpin(origin="activate")  # what activate --pin did
    if lifted is not None:
        log.say(lifted.message)
    elif pinning.state() is not None:
        log.say("pin protection stays (dmlpatch pin made it); dmlpatch unpin lifts it")
    return 0


def _status(arguments: list[str]) -> int:
    from dmlpatch.pinning import pin as pinning
    from dmlpatch.startup import activation

    as_json = "--json" in arguments
    unknown = [a for a in arguments if a != "--json"]
    if unknown:
        raise UsageError(f"status takes only --json; unexpected {unknown[0]!r}")
    device = activation.configured_device()
    data = {
        "version": __version__,
        "activated": device is not None,
        "pth": str(activation.pth_path()),
        "device": device,
        "environment_device": os.environ.get("DMLPATCH_DEVICE"),
        "disabled": os.environ.get("DMLPATCH_DISABLE") == "1",
        "pin": pinning.describe(),
    }
    if as_json:
        import json

        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif device is None:
        sys.stdout.write(f"dmlpatch {__version__}: not activated ({data['pth']} absent)\n")
    else:
        sys.stdout.write(
            f"dmlpatch {__version__}: activated with device {device} ({data['pth']})\n"
        )
    if not as_json:
        sys.stdout.write(pinning.summary() + "\n")
        for problem, fix in pinning.problems():
            sys.stdout.write(f"pin: warning: {problem}" + (f" (fix: {fix})" if fix else "") + "\n")
    return 0


def _list(arguments: list[str]) -> int:
    from dmlpatch.commands import listing

    unknown = [a for a in arguments if a != "--json"]
    if unknown:
        raise UsageError(f"list takes only --json; unexpected {unknown[0]!r}")
    rows = listing.catalogue()
    if "--json" in arguments:
        import json

        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        sys.stdout.write((listing.format_catalogue(rows) or "no patch specs") + "\n")
    return 0


def _scan(arguments: list[str]) -> int:
    from dmlpatch.commands import scan

    flags = [a for a in arguments if a.startswith("-")]
    targets = [a for a in arguments if not a.startswith("-")]
    if any(flag != "--spec" for flag in flags) or len(targets) != 1:
        raise UsageError("usage: dmlpatch scan PACKAGE|PATH [--spec]")
    findings = scan.scan(targets[0])
    if "--spec" in flags:
        sys.stdout.write(scan.spec_skeleton(targets[0], findings))
        return 0
    if findings:
        sys.stdout.write(scan.format_findings(findings) + "\n")
    sites = sum(f.kind != "cuda_branch" for f in findings)
    branches = len(findings) - sites
    log.say(f"{targets[0]}: {sites} CUDA device site(s), {branches} CUDA-only branch(es)")
    return 0


def _doctor(arguments: list[str]) -> int:
    from dmlpatch.commands import doctor

    unknown = [a for a in arguments if a not in ("--json", "--no-import")]
    if unknown:
        raise UsageError(f"doctor takes only --json and --no-import; unexpected {unknown[0]!r}")
    checks = doctor.run_checks(import_targets="--no-import" not in arguments)
    if "--json" in arguments:
        import json

        data = {"checks": doctor.as_json(checks), "exit_code": doctor.exit_code(checks)}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(doctor.format_checks(checks) + "\n")
    return doctor.exit_code(checks)
