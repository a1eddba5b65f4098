"""Warnings torch raises about a call dmlpatch made for the program name the program's line.

Under ``--device cpu`` every rewritten call is the original one, so the program's stderr must
be plain python's, warnings included: ``torch.cuda.amp.GradScaler()``'s deprecation and, on
torch 2.4.1, ``torch.load``'s ``weights_only`` notice named ``dmlpatch/runtime/...`` instead.
"""

from __future__ import annotations

from pathlib import Path

import dmlpatch

from support import run_python

PROGRAM = """
import io
import torch

buffer = io.BytesIO()
torch.save({"w": torch.ones(2)}, buffer)
buffer.seek(0)
state = torch.load(buffer)
scaler = torch.cuda.amp.GradScaler()
with torch.cuda.amp.autocast():
    y = torch.ones(2) * 2
print(sorted(state), float(y.sum()))
"""


def test_warnings_of_rewritten_calls_are_plain_python_s(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(PROGRAM)
    plain = run_python(["-W", "always", "program.py"], cwd=tmp_path)
    patched = run_python(
        ["-W", "always", "-m", "dmlpatch", "--device", "cpu", "program.py"], cwd=tmp_path
    )
    assert plain.code == patched.code == 0, patched.err
    assert patched.out == plain.out
    assert "program.py:9: FutureWarning" in plain.err  # the GradScaler's deprecation
    assert patched.program_err().splitlines() == plain.err.splitlines()
    # No line points into dmlpatch's files (the word itself may be in the venv's path).
    assert str(Path(dmlpatch.__file__).parent) not in patched.program_err()


BACKWARD = """
import torch
import torch.nn.functional as F

x = torch.randn(1, 2, 5, 5, device="cuda", requires_grad=True)
for step in range(STEPS):
    y = F.pad(x, (1, 1, 1, 1), mode="replicate")
    s = torch.histc(y[0, 0], 5)
    loss = y.sum() + s.sum()
    loss.backward()
print(tuple(x.grad.shape), torch.is_anomaly_enabled())
"""


def _fallback_warnings(tmp_path: Path, program: str) -> tuple[list[str], str]:
    (tmp_path / "program.py").write_text(program)
    result = run_python(
        ["-W", "always", "-m", "dmlpatch", "--device", "sim", "program.py"], cwd=tmp_path
    )
    assert result.code == 0, result.err
    warned = [line for line in result.err.splitlines() if "UserWarning: The operator" in line]
    return warned, result.out


def _at(tmp_path: Path, line: int) -> str:
    return f"{tmp_path / 'program.py'}:{line}"


def test_a_backward_operator_s_fallback_warning_names_the_forward_line(tmp_path: Path) -> None:
    # Replication padding's backward falls back in the backward pass, on autograd's device
    # thread: the warning names the F.pad line that made its node (found in the next step,
    # whose forward stacks are recorded), and the recording is off again afterwards.
    warned, out = _fallback_warnings(tmp_path, BACKWARD.replace("STEPS", "3"))
    assert [line.split(": UserWarning")[0] for line in warned] == [
        _at(tmp_path, 8),
        _at(tmp_path, 7),
    ]
    assert "aten::histc" in warned[0] and "aten::replication_pad2d_backward" in warned[1]
    assert out == "(1, 2, 5, 5) False\n"


def test_a_backward_run_once_names_its_backward_line_at_exit(tmp_path: Path) -> None:
    warned, out = _fallback_warnings(tmp_path, BACKWARD.replace("STEPS", "1"))
    assert [line.split(": UserWarning")[0] for line in warned] == [
        _at(tmp_path, 8),
        _at(tmp_path, 10),
    ]
    assert "aten::replication_pad2d_backward" in warned[1]
    # Stacks were still being recorded, waiting for a second backward pass, when it printed.
    assert out == "(1, 2, 5, 5) True\n"


def test_where_the_program_records_stacks_the_first_backward_names_its_line(
    tmp_path: Path,
) -> None:
    program = BACKWARD.replace("STEPS", "1").replace(
        "import torch.nn.functional as F\n",
        "import torch.nn.functional as F\ntorch.autograd.set_detect_anomaly(True)\n",
    )
    warned, out = _fallback_warnings(tmp_path, program)
    assert [line.split(": UserWarning")[0] for line in warned] == [
        _at(tmp_path, 9),
        _at(tmp_path, 8),
    ]
    assert out == "(1, 2, 5, 5) True\n"  # the program's own setting is left as it was


ONCE_THEN_MODULES = """
import torch
import torch.nn.functional as F
from torch import nn

x = torch.randn(1, 2, 5, 5, device="cuda", requires_grad=True)
F.pad(x, (1, 1, 1, 1), mode="replicate").sum().backward()
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU()).cuda()
for step in range(1300):
    model(torch.ones(2, 4, device="cuda")).sum().backward()
print(torch.is_anomaly_enabled())
"""


def test_recording_stops_after_a_budget_of_module_calls(tmp_path: Path) -> None:
    # The padding never falls back again: stacks are recorded for 5,000 module calls (a few
    # steps of most models), not to the program's end; the warning comes at exit.
    warned, out = _fallback_warnings(tmp_path, ONCE_THEN_MODULES)
    assert out == "False\n"
    assert [line.split(": UserWarning")[0] for line in warned] == [_at(tmp_path, 7)]


LARGE_SOLVE = """
import torch

torch.manual_seed(0)
a = torch.randn(32, 32, device="cuda") + 8 * torch.eye(32, device="cuda")
b = torch.randn(32, 2, device="cuda")
x = torch.linalg.solve(a, b)
x = torch.linalg.solve(a, b)
print(float((a @ x - b).abs().max()) < 1e-4)
"""


def test_a_system_too_large_for_the_device_solver_says_it_falls_back(tmp_path: Path) -> None:
    # dmlpatch's solver serves small systems and sends larger ones to the CPU itself, so
    # DirectML never sees the call to warn about it: dmlpatch says it, once, at the line.
    (tmp_path / "program.py").write_text(LARGE_SOLVE)
    result = run_python(["-m", "dmlpatch", "--device", "sim", "program.py"], cwd=tmp_path)
    assert result.code == 0 and result.out.strip() == "True", result.err
    warned = [line for line in result.err.splitlines() if "UserWarning: The operator" in line]
    assert len(warned) == 1
    assert warned[0].startswith(str(tmp_path / "program.py") + ":7: UserWarning")
    assert "'aten::_linalg_solve_ex.result' is not currently supported" in warned[0]
