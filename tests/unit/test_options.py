"""The one parser of the runner's and check's options (``launch.parse_options``)."""

from __future__ import annotations

import pytest

from dmlpatch.errors import UsageError
from dmlpatch.startup import launch


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--device", "sim", "x.py", "--device", "cpu"],
            ("sim", None, None, ["x.py", "--device", "cpu"]),
        ),
        (["--device=sim", "-v", "x.py"], ("sim", None, None, ["x.py"])),
        (["-d", "cpu", "--scope=project", "--report", "x.py"], ("cpu", "project", "-", ["x.py"])),
        (["--report=r.json", "--", "-x.py"], (None, None, "r.json", ["-x.py"])),
        (["--report=", "x.py"], (None, None, "-", ["x.py"])),
        (["-m", "pkg.mod", "--help"], (None, None, None, ["--help"])),  # the module's own
        (["-mpkg", "a"], (None, None, None, ["a"])),
        (["-", "a"], (None, None, None, ["-", "a"])),
    ],
)
def test_options_up_to_the_program(argv: list[str], expected: tuple) -> None:
    options = launch.parse_options(argv)
    assert (options.device, options.scope, options.report, options.rest) == expected
    assert not options.help


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["-h"], ["--device", "sim", "--help"], ["-v", "--scope", "all", "-h", "x.py"]],
)
def test_help_anywhere_among_dmlpatchs_options(argv: list[str]) -> None:
    assert launch.parse_options(argv).help


def test_help_after_the_program_is_the_programs() -> None:
    options = launch.parse_options(["x.py", "--help"])
    assert not options.help and options.rest == ["x.py", "--help"]


def test_check_has_the_runners_options_and_its_own() -> None:
    argv = ["--verify", "--json", "out.json", "--profile=permissive", "-d", "sim", "--help", "p.py"]
    options = launch.parse_options(argv, launch.CHECK_OPTIONS, command="dmlpatch check")
    assert (options.verify, options.json, options.profile, options.device) == (
        True,
        "out.json",
        "permissive",
        "sim",
    )
    assert options.help and options.rest == ["p.py"]


@pytest.mark.parametrize(
    ("argv", "table", "command", "message"),
    [
        (
            ["--device"],
            launch.RUNNER_OPTIONS,
            "dmlpatch",
            "--device needs a value, e.g. --device sim",
        ),
        (["-d"], launch.RUNNER_OPTIONS, "dmlpatch", "-d needs a value, e.g. -d sim"),
        (
            ["--verify", "x.py"],
            launch.RUNNER_OPTIONS,
            "dmlpatch",
            "unknown option '--verify'; see dmlpatch --help",
        ),
        (
            ["--verbose=1"],
            launch.RUNNER_OPTIONS,
            "dmlpatch",
            "unknown option '--verbose=1'; see dmlpatch --help",
        ),
        (
            ["--bogus"],
            launch.CHECK_OPTIONS,
            "dmlpatch check",
            "unknown option '--bogus'; see dmlpatch check --help",
        ),
        (
            ["--json"],
            launch.CHECK_OPTIONS,
            "dmlpatch check",
            "--json needs a value: the file to write",
        ),
        (["-m"], launch.RUNNER_OPTIONS, "dmlpatch", "-m needs a module name"),
        (
            ["--scope", "most"],
            launch.RUNNER_OPTIONS,
            "dmlpatch",
            "unknown scope 'most'; expected one of: all, project, specs",
        ),
    ],
)
def test_mistakes_are_one_line(argv: list[str], table: tuple, command: str, message: str) -> None:
    with pytest.raises(UsageError) as raised:
        launch.parse_options(argv, table, command=command)
    assert str(raised.value) == message
