"""The outputs the documentation shows are what the commands print: each block marked
``<!-- output: NAME -->`` on a page is compared with a run of the program the page shows before
it (its Python blocks that start with ``# file.py``), under the command the scenario names.

The pages show the suite's torch (FLOP estimates and some operators differ between torch
releases); under another torch (``.ci/compat``'s 2.4.1) the comparison is not made."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from support import clean_env, run_python

REPO = Path(__file__).resolve().parents[2]
#: The torch the pages' outputs were made with (scripts/setup.sh's).
DOCS_TORCH = "2.14.1"
DOCS = REPO / "docs"
MARKER = re.compile(r"<!-- output: (?P<name>[a-z0-9-]+) -->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>\w*)\n(?P<body>.*?)^(?P=indent)```\n", re.M | re.S)


class Scenario(NamedTuple):
    page: str
    argv: list[str]
    #: The output lines compared: those from the first starting with this prefix on.
    first: str
    #: Files the page does not show (a program whose only point is the line it prints).
    extra: dict[str, str] = {}


SCENARIOS = {
    "running-on-sim": Scenario(
        "guide/running.md",
        ["-m", "dmlpatch", "--device", "sim", "train.py"],
        "dmlpatch: running on",
        {"train.py": 'import torch\nprint(torch.ones(1, device="cuda").device)\n'},
    ),
    "exit-warning": Scenario(
        "guide/placement.md",
        ["-m", "dmlpatch", "--device", "sim", "--scope", "specs", "train.py"],
        "dmlpatch: warning:",
    ),
    "check-html": Scenario(
        "guide/placement.md",
        ["-m", "dmlpatch", "check", "--html", "page", "train.py"],
        "dmlpatch check:",
    ),
}


def _shown(page: str) -> dict[str, tuple[dict[str, str], str]]:
    """Each marked output of a page: the files shown since the previous marker, and the
    output block's text."""
    text = (DOCS / page).read_text(encoding="utf-8")
    found: dict[str, tuple[dict[str, str], str]] = {}
    files: dict[str, str] = {}
    position = 0
    for marker in MARKER.finditer(text):
        for block in FENCE.finditer(text, position, marker.start()):
            body = _dedent(block.group("body"), len(block.group("indent")))
            first, _, rest = body.partition("\n")
            named = re.fullmatch(r"# (\S+\.py)", first)
            if block.group("info") == "python" and named:
                files[named.group(1)] = rest
        output = FENCE.search(text, marker.end())
        assert output is not None and output.group("info") == "text", marker.group(0)
        found[marker.group("name")] = (
            dict(files),
            _dedent(output.group("body"), len(output.group("indent"))),
        )
        files, position = {}, output.end()
    return found


def _dedent(body: str, indent: int) -> str:
    return "".join(line[indent:] + "\n" for line in body.splitlines())


def test_every_marked_output_has_a_scenario() -> None:
    marked = {name for page in DOCS.rglob("*.md") for name in _shown(str(page.relative_to(DOCS)))}
    assert marked == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_page_shows_what_the_command_prints(name: str, tmp_path: Path) -> None:
    import torch

    if torch.__version__.split("+")[0] != DOCS_TORCH:
        pytest.skip(f"the pages show torch {DOCS_TORCH}'s output, this is {torch.__version__}")
    scenario = SCENARIOS[name]
    files, shown = _shown(scenario.page)[name]
    for file, source in {**files, **scenario.extra}.items():
        (tmp_path / file).write_text(source, encoding="utf-8")
    result = run_python(scenario.argv, cwd=tmp_path, env=clean_env())
    lines = result.err_lines
    starts = [i for i, line in enumerate(lines) if line.startswith(scenario.first)]
    assert starts, result.err
    printed = _program_output(lines[starts[0] :])
    assert _timed("\n".join(printed) + "\n") == _timed(shown), result.err


#: Figures that are timed on the machine that runs it: the wall clock, and CPU fallbacks' kernels
#: (which the modelled time includes). The lines they are on must still match word for word,
#: but for the costliest operators, whose order those timings decide.
_TIMED_LINE = re.compile(r"^(modelled DirectML time: |  by cause: ).*$", re.MULTILINE)
_RANKED_LINE = re.compile(r"^  most: .*$", re.MULTILINE)
_FIGURE = re.compile(r"\d+(?:\.\d+)? (?:ms|µs)")


def _timed(text: str) -> str:
    text = _RANKED_LINE.sub("  most: <operators ranked by timed figures>", text)
    return _TIMED_LINE.sub(lambda line: _FIGURE.sub("<time>", line.group(0)), text)


def _program_output(lines: list[str]) -> list[str]:
    """dmlpatch's lines, without python's warnings (and the source line each quotes)."""
    kept, skip_next = [], False
    for line in lines:
        if skip_next:
            skip_next = False
            continue
        if re.match(r"^\S+\.py:\d+: \w*Warning: ", line):
            skip_next = True
            continue
        kept.append(line)
    return kept
