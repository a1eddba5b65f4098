"""``python -m dmlpatch`` runs programs exactly as ``python`` does (argv, path, exit, errors)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from support import Result, clean_env, run_python

INTROSPECT = """
import json, sys
print(json.dumps({
    "argv": sys.argv,
    "path0": sys.path[0],
    "file": __file__,
    "name": __name__,
    "spec": (__spec__.name, __spec__.origin, __spec__.parent) if __spec__ else None,
    "package": __package__,
    "main_is_this": sys.modules["__main__"].__dict__ is globals(),
}))
"""

PROGRAMS = {
    "ok": "print('hello')\n",
    "exit3": "import sys\nprint('before')\nsys.exit(3)\n",
    "exit_message": "import sys\nsys.exit('fatal: bad things')\n",
    "exit_none": "raise SystemExit\n",
    "error": "def f():\n    raise ValueError('boom')\n\nprint('start')\nf()\n",
    "chained": (
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e\n"
    ),
    "stdin": "import sys\ndata = sys.stdin.read()\nprint(data.upper(), end='')\n",
    "introspect": INTROSPECT,
    "atexit": "import atexit\natexit.register(lambda: print('bye'))\nprint('hi')\n",
    # Ctrl-C: Python prints the traceback once, runs atexit, then ends by SIGINT (130 in a shell).
    "interrupted": (
        "import atexit\natexit.register(lambda: print('bye'))\n"
        "def f():\n    raise KeyboardInterrupt\n\nprint('start', flush=True)\nf()\n"
    ),
}


def _both(script: Path, args: list[str], cwd: Path, stdin: str = "") -> tuple[Result, Result]:
    plain = run_python([str(script.name), *args], cwd=cwd, stdin=stdin)
    patched = run_python(
        ["-m", "dmlpatch", "--device", "cpu", str(script.name), *args], cwd=cwd, stdin=stdin
    )
    return plain, patched


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_script_behaves_like_plain_python(tmp_path: Path, name: str) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(PROGRAMS[name])
    plain, patched = _both(script, ["a", "--flag", "-m", "x y"], tmp_path, stdin="some input\n")
    assert patched.code == plain.code
    assert patched.out == plain.out
    assert patched.program_err() == plain.program_err().strip("\n") or (
        patched.program_err().strip() == plain.err.strip()
    )
    assert patched.err_lines[0].startswith("dmlpatch: running on cpu")


def test_exit_codes_are_the_programs(tmp_path: Path) -> None:
    expected = {"ok": 0, "exit3": 3, "exit_message": 1, "exit_none": 0, "error": 1, "chained": 1}
    # Ended by SIGINT: the shell shows 128 + 2; Windows reports STATUS_CONTROL_C_EXIT.
    expected["interrupted"] = -2 if os.name != "nt" else 0xC000013A
    for name, code in expected.items():
        script = tmp_path / f"{name}.py"
        script.write_text(PROGRAMS[name])
        assert _both(script, [], tmp_path)[1].code == code, name


def test_traceback_shows_only_program_frames(tmp_path: Path) -> None:
    script = tmp_path / "error.py"
    script.write_text(PROGRAMS["error"])
    plain, patched = _both(script, [], tmp_path)
    assert "dmlpatch" not in patched.program_err()
    assert patched.program_err().strip() == plain.err.strip()
    assert "line 5, in <module>" in patched.err


def test_an_interrupted_program_prints_one_traceback(tmp_path: Path) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(PROGRAMS["interrupted"])
    plain, patched = _both(script, [], tmp_path)
    assert patched.program_err().count("Traceback") == 1
    assert "dmlpatch" not in patched.program_err()
    assert patched.program_err().strip() == plain.err.strip()
    assert patched.out == plain.out == "start\nbye\n"


def test_module_mode_behaves_like_python_m(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tool.py").write_text(INTROSPECT)
    (package / "__main__.py").write_text(INTROSPECT)
    for module in ("pkg.tool", "pkg"):
        plain = run_python(["-m", module, "x", "-v"], cwd=tmp_path)
        patched = run_python(
            ["-m", "dmlpatch", "--device", "cpu", "-m", module, "x", "-v"], cwd=tmp_path
        )
        assert patched.code == plain.code == 0, patched.err
        assert patched.out == plain.out


def test_directory_with_main(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("import sys\nprint(sys.argv, sys.path[0] == sys.argv[0])\n")
    plain = run_python(["app", "1"], cwd=tmp_path)
    patched = run_python(["-m", "dmlpatch", "--device", "cpu", "app", "1"], cwd=tmp_path)
    assert patched.code == plain.code == 0, patched.err
    assert patched.out == plain.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "can't open file"),
        (["-m", "no_such_module_here"], "No module named no_such_module_here"),
        (["--device"], "--device needs a value"),
        (["--frobnicate", "x.py"], "unknown option '--frobnicate'"),
        ([], "no script given"),
        # CUDA's absence shows only through torch: said at the program's import of it.
        (["--device", "cuda", "{torch_program}"], "CUDA unavailable"),
        (["run", "no-such-console-script"], "no console script named 'no-such-console-script'"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    program = tmp_path.parent / f"{tmp_path.name}-torch_program.py"
    program.write_text("import torch\nprint('ran')\n")
    args = [str(program) if arg == "{torch_program}" else arg for arg in args]
    result = run_python(["-m", "dmlpatch", *args], cwd=tmp_path)
    assert result.code == 2, result.err
    assert len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith("dmlpatch: error: ")
    assert message in result.err_lines[0]
    assert list(tmp_path.iterdir()) == []


def test_disable_runs_the_program_unpatched(tmp_path: Path) -> None:
    script = tmp_path / "p.py"
    script.write_text("import sys\nprint('dmlpatch.runtime.sites' in sys.modules)\n")
    result = run_python(["-m", "dmlpatch", str(script)], env=clean_env(DMLPATCH_DISABLE="1"))
    assert result.code == 0
    assert result.out == "False\n"
    assert "DMLPATCH_DISABLE=1" in result.err


def test_import_dmlpatch_imports_no_torch() -> None:
    result = run_python(
        [
            "-c",
            "import sys, dmlpatch, dmlpatch.commands.cli, dmlpatch.specs.engine, "
            "dmlpatch.startup.bootstrap; "
            "print(sorted(m for m in ('torch', 'torch_directml', 'wrapt') if m in sys.modules))",
        ]
    )
    assert result.code == 0, result.err
    assert result.out.strip() == "[]"


def test_version_and_help() -> None:
    from dmlpatch import __version__

    result = run_python(["-m", "dmlpatch", "--version"])
    assert (result.code, result.out) == (0, f"dmlpatch {__version__}\n")
    result = run_python(["-m", "dmlpatch", "--help"])
    assert result.code == 0 and "usage: python -m dmlpatch" in result.out
    # --help anywhere among dmlpatch's own options (they exited 2 with "unknown option").
    for argv, usage in (
        (["--device", "sim", "--help"], "usage: python -m dmlpatch"),
        (["check", "--device", "sim", "--help"], "usage: dmlpatch check"),
        (["run", "-d", "sim", "--help"], "usage: dmlpatch run"),
    ):
        result = run_python(["-m", "dmlpatch", *argv])
        assert (result.code, result.err) == (0, ""), argv
        assert result.out.startswith(usage), argv
    assert sys.executable


def test_check_runs_the_program_as_the_runner_does(tmp_path: Path) -> None:
    """check goes through the runner's path with a judge: the runner's --report is written
    too, and the program's exit status and traceback are the runner's."""
    script = tmp_path / "program.py"
    script.write_text("import torch\nx = torch.ones(2).cuda()\nprint(x.device)\n")
    report = tmp_path / "report.json"
    result = run_python(
        ["-m", "dmlpatch", "check", f"--report={report}", "--device", "sim", str(script)],
        cwd=tmp_path,
    )
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == "privateuseone:0"
    assert json.loads(report.read_text())["device"] == "privateuseone:0"
