"""The ``dmlpatch`` command and ``python -m dmlpatch``.

python -m dmlpatch [--device SPEC] [--scope SCOPE] [--report[=FILE]] [-v] script.py [args...]
python -m dmlpatch [options] -m module [args...]
dmlpatch run [options] COMMAND [args...]
dmlpatch check | activate | deactivate | status | doctor | list | scan | pin | unpin

Running a program (a script, ``-m module``, ``run``, ``check``) reads dmlpatch's options up to
the program with one table-driven parser, because everything after it is the program's
(:mod:`dmlpatch.startup.launch`); ``--help`` may come anywhere among them. The other commands
are argparse subcommands, built only when they are asked for: the runner's start-up does not
pay for argparse.
"""

from __future__ import annotations

import os
import sys

from dmlpatch import log
from dmlpatch._version import __version__
from dmlpatch.environment_variables import (
    DMLPATCH_ACCOUNTING,
    DMLPATCH_BF16,
    DMLPATCH_DEBUG,
    DMLPATCH_DEVICE,
    DMLPATCH_DISABLE,
    DMLPATCH_QUIET,
    DMLPATCH_REPORT,
    DMLPATCH_SCOPE,
)
from dmlpatch.errors import DmlpatchError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Callable, NoReturn, Optional

USAGE = f"""\
usage: python -m dmlpatch [--device SPEC] [--report[=FILE]] [-v] script.py [args...]
       python -m dmlpatch [options] -m module [args...]
       dmlpatch run [options] COMMAND [args...]      run a console script such as yolo
       dmlpatch check [options] script.py [args...]  would it run on DirectML? (check --help)
       dmlpatch activate [--device SPEC] [--pin]     patch every Python process of this env
       dmlpatch deactivate                           undo activate
       dmlpatch pin                                  keep torch-directml's torch in pip installs
       dmlpatch unpin                                undo pin
       dmlpatch status                               show activation and device
       dmlpatch doctor [--json] [--failures]         diagnose this environment
       dmlpatch calibrate [--device dml:N|sim]       measure this adapter's costs (a minute)
       dmlpatch list [--json]                        the patch catalogue vs installed libraries
       dmlpatch scan PACKAGE|PATH [--spec]           find CUDA device sites (no import)
       dmlpatch prepare [--jobs N] [PACKAGE ...]     make libraries' first run fast, ahead of it

Every command answers --help.

options:
  --device SPEC     auto (default), dml, dml:N, dml:NAME, privateuseone:N, sim, cpu, cuda, ...
                    also read from ${DMLPATCH_DEVICE}
  --scope SCOPE     where CUDA sites are rewritten: all (default: every module but the standard
                    library and torch's own), project (the program's own modules: outside
                    site-packages), specs (the main script and the modules specs name);
                    also read from ${DMLPATCH_SCOPE}
  --bf16 DTYPE      what bfloat16 runs as on DirectML, which has none: float32 (default:
                    exact) or float16 (half the memory); also read from ${DMLPATCH_BF16}
  --report[=FILE]   at exit, print (or write) a JSON summary; also ${DMLPATCH_REPORT}=FILE
  -v, --verbose     say what is patched; {DMLPATCH_DEBUG}=1 also shows dmlpatch tracebacks
  --version         print dmlpatch's version

At exit, one warning line when most model compute ran on the CPU although an accelerator was
selected; {DMLPATCH_QUIET}=1 keeps it to itself, {DMLPATCH_ACCOUNTING}=0 stops the counting.
"""

RUN_USAGE = """\
usage: dmlpatch run [options] COMMAND [args...]

Run a console script of this environment (yolo, torchrun, ...) with dmlpatch's patches, as
python -m dmlpatch runs a script. The options are those of python -m dmlpatch (dmlpatch --help);
everything from COMMAND on is the command's own.
"""

COMMANDS = (
    *("run", "check", "activate", "deactivate", "status", "doctor", "list", "scan"),
    *("pin", "unpin", "prepare", "calibrate"),
)


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
    from dmlpatch.startup import launch

    if not arguments:
        raise UsageError("no script given; usage: python -m dmlpatch [options] script.py [args...]")
    if arguments[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if arguments[0] == "--version":
        sys.stdout.write(f"dmlpatch {__version__}\n")
        return 0
    command = arguments[0]
    if command in _SUBCOMMANDS:
        return _SUBCOMMANDS[command](arguments[1:])
    if command == "check":
        from dmlpatch.commands import check

        return check.main(arguments[1:])
    if command == "run":
        options = launch.parse_options(arguments[1:], allow_module=False, command="dmlpatch run")
        if options.help:
            sys.stdout.write(RUN_USAGE)
            return 0
        if not options.rest:
            raise UsageError("dmlpatch run needs a command, e.g. dmlpatch run yolo train ...")
        return launch.run_program(options, console_script=True)
    options = launch.parse_options(arguments)
    if options.help:
        sys.stdout.write(USAGE)
        return 0
    if options.module is None and not options.rest:
        raise UsageError("no script given; usage: python -m dmlpatch [options] script.py [args...]")
    if options.module is None and _looks_like_command(options.rest[0]):
        raise UsageError(
            f"{options.rest[0]!r} is neither a dmlpatch command ({', '.join(COMMANDS)}) nor a "
            "file; see dmlpatch --help"
        )
    return launch.run_program(options, console_script=False)


def _looks_like_command(argument: str) -> bool:
    """A bare word that is no file: a mistyped command rather than a missing script."""
    return argument.isidentifier() and argument.islower() and not os.path.exists(argument)


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    """A subcommand's parser whose mistakes are dmlpatch's one-line errors (exit 2)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"dmlpatch {command}: {message}")

    return Parser(
        prog=f"dmlpatch {command}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )


def _parse(
    parser: argparse.ArgumentParser, arguments: list[str], refuse: Callable[[str], str]
) -> argparse.Namespace:
    """Parse; an argument the command does not take is refused with ``refuse(argument)``."""
    namespace, extra = parser.parse_known_args(arguments)
    if extra:
        raise UsageError(refuse(extra[0]))
    return namespace


def _takes_only(command: str, accepted: str) -> Callable[[str], str]:
    def refuse(argument: str) -> str:
        if not accepted:
            return f"{command} takes no arguments; unexpected {argument!r}"
        return f"{command} takes only {accepted}; unexpected {argument!r}"

    return refuse


def _activate(arguments: list[str]) -> int:
    from dmlpatch.devices import resolution
    from dmlpatch.startup import activation

    parser = _parser(
        "activate",
        "Start dmlpatch in every Python process of this environment: writes "
        f"dmlpatch-activate.pth into\nsite-packages. {DMLPATCH_DISABLE}=1 turns it off for one "
        "process; dmlpatch deactivate removes it.\nTheir scripts, own modules and libraries are "
        f"rewritten as under python -m dmlpatch; set\n{DMLPATCH_SCOPE}=project or specs in their "
        "environment for less.",
    )
    parser.add_argument(
        "--device",
        "-d",
        metavar="SPEC",
        default="auto",
        help="the device those processes use (default auto; see dmlpatch --help)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="also pin torch-directml's torch and torchvision for every later pip install here "
        "(what dmlpatch pin does); dmlpatch deactivate lifts that pin too",
    )

    def refuse(argument: str) -> str:
        if argument.partition("=")[0] == "--scope":
            return (
                "activate takes only --device and --pin; for a narrower scope set "
                f"{DMLPATCH_SCOPE} in the environment the programs run in"
            )
        return _takes_only("activate", "--device and --pin")(argument)

    options = _parse(parser, arguments, refuse)
    resolution.parse(options.device)
    path, changed = activation.activate(options.device)
    state = "activated" if changed else "already activated"
    log.say(f"{state}: {path} (device {options.device}); undo with: dmlpatch deactivate")
    if changed:
        log.say(
            "each library's first run here prepares it for DirectML, once; "
            "dmlpatch prepare does that now for every library of the environment"
        )
    if options.pin:
        from dmlpatch.pinning import pin as pinning

        pinning.say_pin("activate")
    return 0


def _deactivate(arguments: list[str]) -> int:
    from dmlpatch.pinning import pin as pinning
    from dmlpatch.startup import activation

    parser = _parser(
        "deactivate",
        "Undo dmlpatch activate: remove dmlpatch-activate.pth, and lift the pin activate --pin "
        "made (a\npin made by dmlpatch pin stays until dmlpatch unpin).",
    )
    _parse(parser, arguments, _takes_only("deactivate", ""))
    done = activation.deactivate()
    if done is None:
        log.say(f"not activated in this environment ({activation.absence()}); nothing to do")
    else:
        log.say(f"deactivated: {done}")
    lifted = pinning.unpin(origin="activate")  # what activate --pin did
    if lifted is not None:
        log.say(lifted.message)
    elif pinning.state() is not None:
        log.say("pin protection stays (dmlpatch pin made it); dmlpatch unpin lifts it")
    return 0


def _status(arguments: list[str]) -> int:
    from dmlpatch.pinning import pin as pinning
    from dmlpatch.startup import activation

    parser = _parser(
        "status",
        "Whether this environment is activated (and with which device), and whether pip is "
        "pinned to\ntorch-directml's torch. Reads files only; imports neither torch nor "
        "torch-directml.",
    )
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    options = _parse(parser, arguments, _takes_only("status", "--json"))
    device = activation.configured_device()
    stale = activation.stale()
    data = {
        "version": __version__,
        "activated": device is not None and stale is None,
        "pth": str(activation.pth_path()),
        "device": device,
        "stale": stale,
        "environment_device": os.environ.get(DMLPATCH_DEVICE),
        "disabled": os.environ.get(DMLPATCH_DISABLE) == "1",
        "pin": pinning.describe(),
    }
    if options.json:
        import json

        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    if device is None:
        sys.stdout.write(f"dmlpatch {__version__}: not activated ({activation.absence()})\n")
    elif stale is not None:
        sys.stdout.write(
            f"dmlpatch {__version__}: not active: {data['pth']} {stale}; run dmlpatch activate "
            "again\n"
        )
    else:
        sys.stdout.write(
            f"dmlpatch {__version__}: activated with device {device} ({data['pth']})\n"
        )
    sys.stdout.write(pinning.summary() + "\n")
    for problem, fix in pinning.problems():
        sys.stdout.write(f"pin: warning: {problem}" + (f" (fix: {fix})" if fix else "") + "\n")
    from dmlpatch.specs import loading

    for spec, replacing in loading.local_specs():
        sys.stdout.write(f"patches: {loading.describe_local(spec, replacing)}\n")
    return 0


def _list(arguments: list[str]) -> int:
    from dmlpatch.commands import listing

    parser = _parser(
        "list",
        "The patch catalogue: each patch spec, the library versions it covers and whether the "
        "installed\nversion is covered.",
    )
    parser.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    options = _parse(parser, arguments, _takes_only("list", "--json"))
    rows = listing.catalogue()
    if options.json:
        import json

        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        sys.stdout.write((listing.format_catalogue(rows) or "no patch specs") + "\n")
    return 0


def _scan(arguments: list[str]) -> int:
    from dmlpatch.commands import scan

    usage = "usage: dmlpatch scan PACKAGE|PATH [--spec]"
    parser = _parser(
        "scan",
        "List the CUDA device sites of an installed package or a source tree, statically "
        "(nothing is\nimported). --spec prints a patch-spec skeleton for them, to start a spec "
        "for a library dmlpatch\ndoes not know yet.",
    )
    parser.usage = "dmlpatch scan PACKAGE|PATH [--spec]"
    parser.add_argument("target", nargs="?", metavar="PACKAGE|PATH")
    parser.add_argument("--spec", action="store_true", help="print a patch-spec skeleton")
    options = _parse(parser, arguments, lambda argument: usage)
    if options.target is None:
        raise UsageError(usage)
    findings = scan.scan(options.target)
    if options.spec:
        sys.stdout.write(scan.spec_skeleton(options.target, findings))
        return 0
    if findings:
        sys.stdout.write(scan.format_findings(findings) + "\n")
    sites = sum(f.kind != "cuda_branch" for f in findings)
    branches = len(findings) - sites
    log.say(f"{options.target}: {sites} CUDA device site(s), {branches} CUDA-only branch(es)")
    return 0


def _doctor(arguments: list[str]) -> int:
    from dmlpatch.commands import doctor

    parser = _parser(
        "doctor",
        "Check this environment: Python, torch and torch-directml versions and pins, DirectML "
        "adapters,\nCUDA, the installed target libraries, activation, pin protection, dmlpatch's "
        "cache and the\nsimulated device. Exit code 1 when a check FAILs.",
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"checks": [...], "exit_code": 0|1}'
    )
    parser.add_argument(
        "--no-import", action="store_true", help="do not import the target libraries (faster)"
    )
    parser.add_argument(
        "--failures",
        action="store_true",
        help="print the catalogue of known torch-directml failures (with --json: as JSON)",
    )
    options = _parse(parser, arguments, _takes_only("doctor", "--json, --no-import and --failures"))
    if options.failures:
        return _failures(as_json=options.json)
    checks = doctor.run_checks(import_targets=not options.no_import)
    if options.json:
        import json

        data = {"checks": doctor.as_json(checks), "exit_code": doctor.exit_code(checks)}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(doctor.format_checks(checks) + "\n")
    return doctor.exit_code(checks)


def _calibrate(arguments: list[str]) -> int:
    from dmlpatch.commands import calibrate

    parser = _parser(
        "calibrate",
        "Measure what device work costs on this DirectML adapter (kernel launch, read-back, "
        "copies\nboth ways, memory bandwidth, float32 and float16 products, the CPU's own "
        "fallback kernels) in\nunder a minute, and keep the profile in dmlpatch's cache: "
        "later runs on this adapter and\ndriver choose between a fix and DirectML's CPU "
        "fallback by it.",
    )
    parser.add_argument(
        "--device",
        default="dml",
        metavar="SPEC",
        help="dml (default), dml:N, or sim (the simulated device, on the cost model's clock)",
    )
    parser.add_argument("--json", action="store_true", help="print the measured profile as JSON")
    parser.add_argument("--no-save", action="store_true", help="measure and print, write nothing")
    options = _parse(parser, arguments, _takes_only("calibrate", "--device, --json and --no-save"))
    return calibrate.main(options.device, options.json, not options.no_save)


def _failures(as_json: bool) -> int:
    from dmlpatch.gaps import catalogue

    if as_json:
        import json

        entries = [failure._asdict() for failure in catalogue.FAILURES]
        sys.stdout.write(json.dumps({"failures": entries}, indent=2) + "\n")
    else:
        sys.stdout.write(catalogue.summary() + "\n\n" + catalogue.table())
    return 0


def _pin(arguments: list[str]) -> int:
    from dmlpatch.pinning import pin as pinning

    parser = _parser(
        "pin",
        "Make every later pip install in this environment keep the torch and torchvision that\n"
        "torch-directml requires (read from its installed metadata): writes "
        "dmlpatch-pin/constraints.txt\nunder this environment's prefix and names it under "
        "[install] constraint in the environment's\nown pip configuration file (pip.conf, or "
        "pip.ini on Windows, in that prefix). No pip\nconfiguration outside the environment is "
        "touched; one already there is kept and given back\nbyte for byte by dmlpatch unpin. A "
        "library that needs another torch then fails to install,\nwith pip's \"The user "
        'requested (constraint) torch==..." line. Without torch-directml installed\nthere is '
        "nothing to pin. Run it again after installing another torch-directml.",
    )
    _parse(parser, arguments, _takes_only("pin", ""))
    pinning.say_pin("pin")
    return 0


def _unpin(arguments: list[str]) -> int:
    from dmlpatch.pinning import pin as pinning

    parser = _parser(
        "unpin",
        "Lift dmlpatch pin: give the environment's pip configuration file back as it was before "
        "(or\nremove it, when pin created it) and remove dmlpatch-pin/.",
    )
    _parse(parser, arguments, _takes_only("unpin", ""))
    outcome = pinning.unpin()
    if outcome is None:
        log.say(f"not pinned in this environment ({pinning.directory()} absent); nothing to do")
    else:
        log.say(outcome.message)
    return 0


def _prepare(arguments: list[str]) -> int:
    from dmlpatch.commands import prepare

    parser = _parser(
        "prepare",
        "Do the preparation of a library's first run under dmlpatch ahead of it: examine every "
        "module of\neach PACKAGE for CUDA sites and rewrite and compile those with sites into "
        "dmlpatch's caches,\nin several processes, as a run would while importing them. Nothing "
        "is imported or run.\nWithout PACKAGE: every package of this environment's "
        "site-packages that dmlpatch may rewrite.\nRun it again after installing or upgrading "
        "libraries (a run does it for what it imports).",
    )
    parser.add_argument("packages", nargs="*", metavar="PACKAGE")
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="processes at once (default: the CPU count)"
    )
    options = _parse(
        parser,
        arguments,
        lambda argument: f"dmlpatch prepare: unexpected {argument!r}; see dmlpatch prepare --help",
    )
    return prepare.main(options.packages, options.jobs)


_SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "activate": _activate,
    "deactivate": _deactivate,
    "status": _status,
    "doctor": _doctor,
    "calibrate": _calibrate,
    "list": _list,
    "scan": _scan,
    "pin": _pin,
    "unpin": _unpin,
    "prepare": _prepare,
}
