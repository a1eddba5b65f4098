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

from dmlpatch import changes, log
from dmlpatch.environment_variables import (
    DMLPATCH_BF16,
    DMLPATCH_DISABLE,
    DMLPATCH_REPORT,
    DMLPATCH_SCOPE,
    DMLPATCH_VERBOSE,
)
from dmlpatch.errors import DmlpatchError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple, Optional, Protocol
else:
    from dmlpatch._tuple import NamedTuple

    Protocol = object


#: How an option takes its value: ``--device sim`` / ``--device=sim``; ``--verify``;
#: ``--report`` or ``--report=FILE``.
VALUE, FLAG, OPTIONAL_VALUE = "value", "flag", "optional value"


class Option(NamedTuple):
    """One of dmlpatch's options before the program: its names, the :class:`Options` field it
    sets, how it takes a value and the one-line error when the value is missing."""

    names: tuple[str, ...]
    field: str
    takes: str
    missing: str = ""


#: The runner's options (``python -m dmlpatch``, ``dmlpatch run``).
RUNNER_OPTIONS = (
    Option(("--device", "-d"), "device", VALUE, "{name} needs a value, e.g. {name} sim"),
    Option(("--scope",), "scope", VALUE, "--scope needs a value: all, project or specs"),
    Option(("--bf16",), "bf16", VALUE, "--bf16 needs a value: float32 or float16"),
    Option(("--report",), "report", OPTIONAL_VALUE),
    Option(("-v", "--verbose"), "verbose", FLAG),
)
#: ``dmlpatch check``'s: the runner's and its own.
CHECK_OPTIONS = (
    *RUNNER_OPTIONS,
    Option(("--profile",), "profile", VALUE, "--profile needs a value, e.g. --profile permissive"),
    Option(("--json",), "json", VALUE, "--json needs a value: the file to write"),
    Option(("--html",), "html", VALUE, "--html needs a value: the directory to write the page in"),
    Option(("--verify",), "verify", FLAG),
)


class Options:
    """dmlpatch's own command-line options (a plain class: dataclasses costs ~6 ms to import)."""

    def __init__(self) -> None:
        self.device: Optional[str] = None
        self.scope: Optional[str] = None
        self.bf16: Optional[str] = None
        self.report: Optional[str] = None
        self.verbose = False
        self.profile: Optional[str] = None
        self.json: Optional[str] = None
        self.html: Optional[str] = None
        self.verify = False
        self.help = False
        self.module: Optional[str] = None
        self.rest: list[str] = []


def parse_options(
    argv: list[str],
    table: tuple[Option, ...] = RUNNER_OPTIONS,
    allow_module: bool = True,
    command: str = "dmlpatch",
) -> Options:
    """dmlpatch's own options up to the program; everything after belongs to the program.

    The one parser of the runner and ``check`` (``table`` says which options there are):
    ``-h``/``--help`` anywhere among them sets ``help``; ``--`` ends them; ``-m MODULE`` (where
    ``allow_module``) ends them with the module; anything else starting with ``-`` is a one-line
    error naming ``command``'s help.
    """
    options = Options()
    by_name = {name: option for option in table for name in option.names}
    index = 0
    while index < len(argv):
        argument = argv[index]
        name, equals, value = argument.partition("=")
        option = by_name.get(name)
        if argument == "--":
            index += 1
            break
        if argument in ("-h", "--help"):
            options.help = True
        elif option is not None and option.takes == FLAG and not equals:
            setattr(options, option.field, True)
        elif option is not None and option.takes == OPTIONAL_VALUE:
            setattr(options, option.field, value or "-")
        elif option is not None and option.takes == VALUE:
            if not equals:
                if index + 1 >= len(argv):
                    raise UsageError(option.missing.format(name=name))
                index += 1
                value = argv[index]
            setattr(options, option.field, value)
            if option.field == "scope":
                options.scope = parse_scope(value)  # named in the order given
            elif option.field == "bf16":
                options.bf16 = parse_bf16(value)
        elif allow_module and argument.startswith("-m"):
            if argument == "-m" and index + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            options.module = argument[2:] or argv[index + 1]
            index += 1 if argument != "-m" else 2
            break
        elif argument.startswith("-") and argument != "-":
            raise UsageError(f"unknown option {argument!r}; see {command} --help")
        else:
            break
        index += 1
    options.rest = argv[index:]
    if options.device is not None and not options.help:
        from dmlpatch.devices import resolution

        resolution.parse(options.device)  # named before the script: it was given first
    return options


def parse_scope(text: str) -> str:
    from dmlpatch.rewriting import scope

    return scope.parse_scope(text)


def parse_bf16(text: str) -> str:
    from dmlpatch.gaps import bf16_setting

    return bf16_setting.parse_bf16(text, "--bf16 ")


def prepare(options: Options, report: Optional[str] = None) -> bool:
    """Check what can be checked without torch (one-line errors, before the program starts),
    then patch (:func:`dmlpatch.startup.sequence.start`); the device is resolved when the
    program first imports torch. ``report``: written at exit. Returns whether patches are
    active."""
    from dmlpatch.devices import announce
    from dmlpatch.specs import engine
    from dmlpatch.startup import sequence

    if options.verbose:
        changes.set_environment(DMLPATCH_VERBOSE, "1")
    from dmlpatch.gaps import bf16_setting

    if options.bf16:
        changes.set_environment(DMLPATCH_BF16, options.bf16)  # children too
    bf16_setting.parse_bf16(os.environ.get(DMLPATCH_BF16))  # a bad one is exit 2
    if engine.disabled():
        log.say(f"{DMLPATCH_DISABLE}=1: running the program without patches")
        if report:
            from dmlpatch import report as reports

            atexit.register(reports.write, report)
        return False
    scope_text = options.scope or os.environ.get(DMLPATCH_SCOPE)
    scope = parse_scope(scope_text) if scope_text else None  # a bad one is exit 2, before anything
    started = sequence.start(
        options.device,
        scope,
        eager=True,
        children=True,
        # torchrun's workers: rank 0's start-up says the line for the job.
        speaks=announce.resolved if "LOCAL_RANK" not in os.environ else None,
        report=report,
    )
    return bool(started)


class Judge(Protocol):
    """What ``dmlpatch check`` adds to running a program: :meth:`begin` once patches are in,
    :meth:`end` with how the program ended (its uncaught exception, or None, and its exit
    status), returning the process's exit status."""

    def begin(self) -> None: ...

    def end(self, error: Optional[BaseException], code: int) -> int: ...


def run_program(options: Options, console_script: bool, judge: Optional[Judge] = None) -> int:
    """Run the program as python would, with patches active; the runner's and check's path.

    Without a ``judge`` the program's ``SystemExit`` passes through, so python ends the process
    as it would have; an uncaught exception prints the program's traceback and is exit 1.
    """
    from dmlpatch import report
    from dmlpatch.startup import runner

    destination = options.report or os.environ.pop(DMLPATCH_REPORT, None)
    if destination:
        report.check_destination(destination)
        if report.per_process(destination):
            # Children (DDP ranks, workers) write theirs; they may start in another directory.
            changes.set_environment(DMLPATCH_REPORT, os.path.abspath(destination))
    if console_script:
        runner.find_console_script(options.rest[0])
    elif options.module is not None:
        # python -m looks in the working directory first; the dmlpatch console script's
        # sys.path[0] is its own bin directory until run_module sets it.
        sys.path[0] = os.getcwd()
        runner.check_module(options.module)
    else:
        runner.check_path(options.rest[0])
    active = prepare(options, destination)
    if judge is not None:
        judge.begin()
    program_file: Optional[str] = None
    error: Optional[BaseException] = None
    code = 0
    try:
        if console_script:
            code = runner.exit_status(runner.run_console_script(options.rest[0], options.rest[1:]))
        elif options.module is not None:
            runner.run_module(options.module, options.rest, rewrite=active)
        else:
            program_file = os.path.abspath(options.rest[0])
            runner.run_path(options.rest[0], options.rest[1:], rewrite=active)
    except SystemExit as stop:
        if judge is None:
            raise
        code = runner.exit_status(stop.code)
    except UsageError:
        raise
    except BaseException as caught:
        if isinstance(caught, DmlpatchError):
            if log.debug_enabled():
                import traceback

                traceback.print_exc()
            log.say(f"error: {caught}")
            return caught.exit_code
        error = caught
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        trimmed = runner.program_traceback(error, program_file or main_file)
        # Chained exceptions are printed from __traceback__, so trim it on the exception too.
        sys.excepthook(type(error), error.with_traceback(trimmed), trimmed)
        from dmlpatch.rewriting import missed

        missed.say(error)
        code = 1
    if judge is not None:
        code = judge.end(error, code)
    if isinstance(error, KeyboardInterrupt):
        # Python ends an interrupted program by SIGINT (130 in a shell; Windows' own code
        # there) once it has shut down: the interpreter does that for an uncaught
        # KeyboardInterrupt, so it gets this one, without printing it a second time.
        sys.excepthook = runner.printed_already
        raise error
    return code
