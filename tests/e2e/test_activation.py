"""``dmlpatch activate`` in a throw-away virtual environment: a .pth, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import clean_env, linked_venv, run_python

CHECK = (
    "import sys; from dmlpatch.specs import engine; print(engine.is_patched(), "
    "'torch' in sys.modules, 'dmlpatch.startup.bootstrap' in sys.modules)"
)


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[str, Path]]:
    yield from linked_venv()


def _listing(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def test_round_trip(env: tuple[str, Path]) -> None:
    python, purelib = env
    before = _listing(purelib)
    result = run_python(["-m", "dmlpatch", "activate", "--device", "cpu"], python=python)
    assert result.code == 0, result.err
    assert _listing(purelib) - before == {"dmlpatch-activate.pth"}
    assert before - _listing(purelib) == set()
    assert "activated:" in result.err
    assert "dmlpatch prepare does that now for every library of the environment" in result.err

    fresh = run_python(["-c", CHECK], python=python)
    assert (fresh.code, fresh.out) == (0, "True False True\n"), fresh.err

    status = run_python(["-m", "dmlpatch", "status"], python=python)
    assert "activated with device cpu" in status.out
    doctor = run_python(["-m", "dmlpatch", "doctor", "--no-import"], python=python)
    assert f"OK   activation activated with device cpu ({purelib / 'dmlpatch-activate.pth'})" in (
        doctor.out
    )

    again = run_python(["-m", "dmlpatch", "activate", "--device", "cpu"], python=python)
    assert again.code == 0 and "already activated" in again.err
    assert "dmlpatch prepare" not in again.err  # said once, when it activates

    disabled = run_python(["-c", CHECK], python=python, env=clean_env(DMLPATCH_DISABLE="1"))
    assert disabled.out == "False False False\n"

    result = run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert result.code == 0 and "deactivated" in result.err
    assert _listing(purelib) == before
    plain = run_python(["-c", CHECK], python=python)
    assert plain.out == "False False False\n"

    result = run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert result.code == 0 and "nothing to do" in result.err


def test_device_change_rewrites_the_same_file(env: tuple[str, Path]) -> None:
    python, purelib = env
    run_python(["-m", "dmlpatch", "activate"], python=python)
    result = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
    assert result.code == 0 and "activated:" in result.err
    status = run_python(["-m", "dmlpatch", "status", "--json"], python=python)
    assert '"device": "sim"' in status.out
    run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert not (purelib / "dmlpatch-activate.pth").exists()


def test_bad_device_writes_nothing(env: tuple[str, Path]) -> None:
    python, purelib = env
    before = _listing(purelib)
    result = run_python(["-m", "dmlpatch", "activate", "--device", "gpu"], python=python)
    assert result.code == 2
    assert result.err_lines == [result.err_lines[0]]
    assert "unknown device spec 'gpu'" in result.err
    assert _listing(purelib) == before


def test_read_only_site_packages_is_one_line(env: tuple[str, Path]) -> None:
    python, purelib = env
    before = _listing(purelib)
    # As an unprivileged user, like anyone without admin rights on a system Python.
    completed = subprocess.run(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            python,
            "-m",
            "dmlpatch",
            "activate",
        ],
        capture_output=True,
        text=True,
        env=clean_env(HOME="/tmp"),
    )
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"dmlpatch: error: cannot write to {purelib}: Permission denied")
    assert _listing(purelib) == before


def test_bootstrap_line_never_fails_without_dmlpatch(env: tuple[str, Path], tmp_path: Path) -> None:
    """After an editable install is uninstalled its sources stay, the guard file with them: the
    line must still say nothing (it printed python's 7-line "Error processing line 1")."""
    python, purelib = env
    run_python(["-m", "dmlpatch", "activate"], python=python)
    try:
        # An interpreter that cannot see dmlpatch (isolated from our link) still starts cleanly.
        line = (purelib / "dmlpatch-activate.pth").read_text()
        isolated = tmp_path / "isolated.pth"
        isolated.write_text(line)
        result = subprocess.run(
            [
                sys.executable,
                "-S",
                "-c",
                f"import site; site.addpackage({str(tmp_path)!r}, 'isolated.pth', set()); "
                "print('up')",
            ],
            capture_output=True,
            text=True,
            env={**clean_env(), "PYTHONPATH": os.devnull},
        )
        assert (result.returncode, result.stdout, result.stderr) == (0, "up\n", "")
    finally:
        run_python(["-m", "dmlpatch", "deactivate"], python=python)


def test_other_lines_of_the_pth_are_kept(env: tuple[str, Path]) -> None:
    """A line someone else added to dmlpatch-activate.pth: status still finds dmlpatch's line,
    and activate and deactivate leave the other one as it was."""
    python, purelib = env
    pth = purelib / "dmlpatch-activate.pth"
    theirs = "# kept by the user\nimport os; os.environ.setdefault('THEIRS', '1')\n"
    assert run_python(["-m", "dmlpatch", "activate", "--device", "cpu"], python=python).code == 0
    try:
        pth.write_text(theirs + pth.read_text())
        status = run_python(["-m", "dmlpatch", "status"], python=python)
        assert (
            status.out.splitlines()[0]
            == f"dmlpatch {_version()}: activated with device cpu ({pth})"
        )
        again = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
        assert again.code == 0 and "dmlpatch: activated:" in again.err
        assert pth.read_text().startswith(theirs)
        fresh = run_python(["-c", "import os; print(os.environ.get('THEIRS'))"], python=python)
        assert fresh.out == "1\n"
        gone = run_python(["-m", "dmlpatch", "deactivate"], python=python)
        assert gone.err_lines[0] == (
            f"dmlpatch: deactivated: took dmlpatch's line out of {pth} (its other lines stay)"
        )
        assert pth.read_text() == theirs
        status = run_python(["-m", "dmlpatch", "status"], python=python)
        assert status.out.splitlines()[0] == (
            f"dmlpatch {_version()}: not activated (no line of dmlpatch's in {pth})"
        )
    finally:
        pth.unlink(missing_ok=True)


def _version() -> str:
    from dmlpatch import __version__

    return __version__


_CRASH_DURING_WRITE = """
import os, sys
from dmlpatch.startup import activation
def killed(*args, **kwargs):
    os._exit(9)  # the process dies after writing the temporary file, before the rename
os.replace = killed
activation.activate(sys.argv[1])
"""


@pytest.mark.parametrize("activated_before", [False, True])
def test_a_crash_mid_write_leaves_no_partial_pth(
    env: tuple[str, Path], activated_before: bool
) -> None:
    python, purelib = env
    pth = purelib / "dmlpatch-activate.pth"
    if activated_before:
        run_python(["-m", "dmlpatch", "activate", "--device", "cpu"], python=python)
    before = pth.read_text() if activated_before else None
    try:
        crashed = run_python(["-c", _CRASH_DURING_WRITE, "sim"], python=python)
        assert crashed.code == 9
        # The old file, whole, or none at all: never a half-written one.
        assert (pth.read_text() if pth.exists() else None) == before
        leftovers = [p for p in purelib.iterdir() if p.name.startswith(".dmlpatch-")]
        assert all(p.suffix == ".tmp" for p in leftovers)  # site.py reads only *.pth
        started = run_python(["-c", CHECK], python=python)
        assert started.code == 0, started.err
        assert started.out == ("True False True\n" if activated_before else "False False False\n")
    finally:
        run_python(["-m", "dmlpatch", "deactivate"], python=python)
        for leftover in purelib.glob(".dmlpatch-*.tmp"):
            leftover.unlink()


def test_device_text_is_never_run_as_code(env: tuple[str, Path], tmp_path: Path) -> None:
    """Neither --device nor $DMLPATCH_DEVICE is evaluated: code there is an unknown spec."""
    python, purelib = env
    marker = tmp_path / "ran"
    payload = f"__import__('os').system('touch {marker}')"
    rejected = run_python(["-m", "dmlpatch", "activate", "--device", payload], python=python)
    assert rejected.code == 2 and "unknown device spec" in rejected.err
    assert not (purelib / "dmlpatch-activate.pth").exists()
    run_python(["-m", "dmlpatch", "activate"], python=python)
    try:
        started = run_python(["-c", CHECK], python=python, env=clean_env(DMLPATCH_DEVICE=payload))
        assert started.code == 0, started.err
        assert started.err_lines == [
            f"dmlpatch: warning: patches not active in this process: unknown device spec "
            f"{payload!r}; expected one of: auto, dml, dml:N, dml:N,M, dml:NAME, "
            "privateuseone:N, sim, sim:N, cpu, cuda, cuda:N, mps, xpu"
        ]
        assert started.out == "False False True\n"
    finally:
        run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert not marker.exists()


def test_a_line_from_another_installation_is_reported_and_replaced(env: tuple[str, Path]) -> None:
    """A .pth whose bootstrap file is gone (an older layout, or another checkout) starts nothing:
    status and doctor say so instead of "activated", and activate writes the current line."""
    python, purelib = env
    pth = purelib / "dmlpatch-activate.pth"
    gone = str(purelib / "old-dmlpatch" / "bootstrap.py")
    pth.write_text(
        f"import os; os.path.exists({gone!r}) and "
        "__import__('dmlpatch.bootstrap').bootstrap.startup('sim')\n",
        encoding="utf-8",
    )
    try:
        assert run_python(["-c", CHECK], python=python).out == "False False False\n"
        status = run_python(["-m", "dmlpatch", "status"], python=python)
        assert status.code == 0
        assert f"not active: {pth} names {gone}, which does not exist" in status.out
        assert "run dmlpatch activate again" in status.out
        doctor = run_python(["-m", "dmlpatch", "doctor", "--no-import"], python=python)
        assert f"WARN activation not active: {pth} names {gone}" in doctor.out
        assert "dmlpatch activate --device sim" in doctor.out

        again = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
        assert again.code == 0 and "dmlpatch: activated:" in again.err
        assert run_python(["-c", CHECK], python=python).out == "True False True\n"
        status = run_python(["-m", "dmlpatch", "status", "--json"], python=python)
        assert '"stale": null' in status.out and '"activated": true' in status.out
    finally:
        pth.unlink(missing_ok=True)


WARM_UP_FIRST = """
import torch
w = torch.ones(2, requires_grad=True)
(w * 2).sum().backward()  # a sanity check on the CPU, before any CUDA site
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.ones(2, device=device, requires_grad=True)
(x * 3).sum().backward()
print(device, x.grad.cpu().tolist())
"""

#: PyTorch's autograd engine, when the device was registered after its first backward pass.
DEVICE_QUEUES = "device_ready_queues_.size()) INTERNAL ASSERT FAILED"


def test_a_backward_on_the_cpu_before_the_first_cuda_site(
    env: tuple[str, Path], tmp_path: Path
) -> None:
    """microsoft/DirectML#668: the engine sizes its device queues at its first backward. An
    activated process registers the device before that one, whatever ran it."""
    python, _ = env
    script = tmp_path / "warm_up_first.py"
    script.write_text(WARM_UP_FIRST)
    expected = "privateuseone:0 [3.0, 3.0]"
    activated = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
    assert activated.code == 0, activated.err
    try:
        result = run_python([str(script)], python=python)
    finally:
        run_python(["-m", "dmlpatch", "deactivate"], python=python)
    assert result.code == 0, result.err
    assert result.out.strip() == expected
    auto = tmp_path / "auto_first.py"
    auto.write_text("import dmlpatch.auto\n" + WARM_UP_FIRST)
    result = run_python([str(auto)], env=clean_env(DMLPATCH_DEVICE="sim"))
    assert result.code == 0, result.err
    assert result.out.strip() == expected
    # Without dmlpatch, the device registered after that first backward has no queue.
    late = "import torch\n(torch.ones(1, requires_grad=True) * 2).sum().backward()\n" + (
        "import dmlpatch.sim as sim\nsim.load()\n"
        "(torch.ones(1, device=sim.device(), requires_grad=True) * 2).sum().backward()\n"
    )
    result = run_python(["-c", late], env=clean_env())
    assert result.code == 1 and DEVICE_QUEUES in result.err
