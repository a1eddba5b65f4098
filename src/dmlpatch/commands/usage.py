"""What ``dmlpatch COMMAND --help`` prints, for each command that has no parser of its own.

``dmlpatch --help`` (cli.USAGE) lists the commands and the options shared by ``python -m
dmlpatch`` and ``dmlpatch run``; ``dmlpatch check --help`` is check.py's. Each text says what
the command does, what it writes and how to undo it.
"""

from __future__ import annotations

HELP = {
    "run": """\
usage: dmlpatch run [options] COMMAND [args...]

Run a console script of this environment (yolo, torchrun, ...) with dmlpatch's patches, as
python -m dmlpatch runs a script. The options are those of python -m dmlpatch (dmlpatch --help);
everything from COMMAND on is the command's own.
""",
    "activate": """\
usage: dmlpatch activate [--device SPEC] [--pin]

Start dmlpatch in every Python process of this environment: writes dmlpatch-activate.pth into
site-packages. DMLPATCH_DISABLE=1 turns it off for one process; dmlpatch deactivate removes it.
Their scripts, own modules and libraries are rewritten as under python -m dmlpatch; set
DMLPATCH_SCOPE=project or specs in their environment for less.

  --device SPEC   the device those processes use (default auto; see dmlpatch --help)
  --pin           also pin torch-directml's torch and torchvision for every later pip install
                  here (what dmlpatch pin does); dmlpatch deactivate lifts that pin too
""",
    "deactivate": """\
usage: dmlpatch deactivate

Undo dmlpatch activate: remove dmlpatch-activate.pth, and lift the pin activate --pin made (a
pin made by dmlpatch pin stays until dmlpatch unpin).
""",
    "status": """\
usage: dmlpatch status [--json]

Whether this environment is activated (and with which device), and whether pip is pinned to
torch-directml's torch. Reads files only; imports neither torch nor torch-directml.
""",
    "doctor": """\
usage: dmlpatch doctor [--json] [--no-import]

Check this environment: Python, torch and torch-directml versions and pins, DirectML adapters,
CUDA, the installed target libraries, activation, pin protection, dmlpatch's cache and the
simulated device. Exit code 1 when a check FAILs.

  --json        print {"checks": [...], "exit_code": 0|1}
  --no-import   do not import the target libraries (faster)
""",
    "list": """\
usage: dmlpatch list [--json]

The patch catalogue: each patch spec, the library versions it covers and whether the installed
version is covered.
""",
    "scan": """\
usage: dmlpatch scan PACKAGE|PATH [--spec]

List the CUDA device sites of an installed package or a source tree, statically (nothing is
imported). --spec prints a patch-spec skeleton for them, to start a spec for a library dmlpatch
does not know yet.
""",
    "pin": """\
usage: dmlpatch pin

Make every later pip install in this environment keep the torch and torchvision that
torch-directml requires (read from its installed metadata): writes dmlpatch-pin/constraints.txt
under this environment's prefix and names it under [install] constraint in the environment's
own pip configuration file (pip.conf, or pip.ini on Windows, in that prefix). No pip
configuration outside the environment is touched; one already there is kept and given back
byte for byte by dmlpatch unpin. A library that needs another torch then fails to install,
with pip's "The user requested (constraint) torch==..." line. Without torch-directml installed
there is nothing to pin. Run it again after installing another torch-directml.
""",
    "unpin": """\
usage: dmlpatch unpin

Lift dmlpatch pin: give the environment's pip configuration file back as it was before (or
remove it, when pin created it) and remove dmlpatch-pin/.
""",
}


def wants_help(arguments: list[str]) -> bool:
    """``dmlpatch COMMAND --help`` (or ``-h``): the first word after the command only."""
    return arguments[:1] in (["-h"], ["--help"])
