"""``dmlpatch check``: the table, verdict and exit status on programs with known gaps, and
``--verify`` catching a silently dropped write without false alarms on the example CNN."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from support import REPO, clean_env, run_python

GAPS = """
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.tensor([0, 0, 1, 3, 3], device=device)
for step in range(3):
    values, counts = x.unique(return_counts=True)
    y = torch.hypot(x.float(), x.float() + 1)
z = torch.ones(1, 2, 3, 1, 1, device=device).repeat(1, 1, 1, 2, 2)
print("counts", counts.tolist(), tuple(z.shape))
"""

REFUSED = """
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
base = torch.zeros(4, 5, device=device)
index = torch.tensor([[0, 3], [2, 1]], device=device)
torch.hypot(base, base)
torch.scatter(base, 0, index, torch.ones(3, 3, device=device), out=torch.empty_like(base))
"""

WRITE = """
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
t = torch.zeros(4, device=device) + 1
t[2] = 5.0
print(t.sum().item())
"""


def _check(
    tmp_path: Path, write: Callable[[str, str], Path], source: str, *options: str, **env: str
) -> tuple[Any, dict[str, Any]]:
    script = write("program.py", source)
    report = tmp_path / "check.json"
    result = run_python(
        ["-m", "dmlpatch", "check", *options, "--json", str(report), script.name],
        cwd=script.parent,
        env=clean_env(**env),
    )
    return result, json.loads(report.read_text())


def test_table_and_verdict_for_known_gaps(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    result, data = _check(tmp_path, write, GAPS)
    assert result.code == 0, result.err
    assert "counts [2, 1, 2] (1, 2, 3, 2, 2)" in result.out
    assert data["ops"] == [
        {
            "op": "aten::hypot.out",
            "how": "fallback",
            "calls": 3,
            "copies": 9,
            "bytes": 180,
            "first_call": "program.py:7",
            "known_failure": None,
        },
        {
            "op": "aten::_unique2",
            "how": "fixed",
            "calls": 3,
            "copies": 0,
            "bytes": 0,
            "first_call": "program.py:6",
            "known_failure": "unique-counts/unique-inverse",
        },
        {
            "op": "aten::repeat",
            "how": "fixed",
            "calls": 1,
            "copies": 0,
            "bytes": 0,
            "first_call": "program.py:8",
            "known_failure": "repeat-rank",
        },
    ]
    verdict = (
        "runs on DirectML with 1 fallback costing 9 copies (180 B) per run; "
        "2 operators fixed on the device"
    )
    assert (data["status"], data["exit_code"], data["verdict"]) == ("runs", 0, verdict)
    lines = result.err.splitlines()
    assert lines[-1] == "verdict: " + verdict
    assert lines[-5].split() == [
        "operator",
        "how",
        "calls",
        "copies",
        "bytes",
        "first",
        "called",
        "at",
        "known",
        "as",
    ]
    assert lines[-4].split() == [
        "aten::hypot.out",
        "fallback",
        "3",
        "9",
        "180",
        "program.py:7",
        "-",
    ]
    assert lines[-3].split() == [
        "aten::_unique2",
        "fixed",
        "3",
        "-",
        "-",
        "program.py:6",
        "unique-counts/unique-inverse",
    ]


WIDE_AND_HALF = """
import torch

x = torch.randn(70, 66, device="cuda")
for step in range(2):
    s = torch.linalg.svdvals(x @ torch.randn(66, 66, device="cuda"))
    h = torch.histc(x, 10)
print(float(s[0]) > 0, int(h.sum()))
"""


def test_a_fix_kernel_s_own_fallback_is_counted_in_check_and_in_a_run(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    # svdvals of 66 columns is wider than the device's Jacobi and histc is served by the
    # float16-on-host kernel: dmlpatch's own kernels send both through the CPU, per call.
    # check's table, its headline and the compute section agree on them, and so does an
    # ordinary run's report, whose exit line names them.
    result, data = _check(tmp_path, write, WIDE_AND_HALF)
    assert result.code == 0, result.err
    table = {row["op"] for row in data["ops"] if row["how"] == "fallback"}
    assert table == {"aten::_linalg_svd.U", "aten::histc"}
    counted = {entry["operator"] for entry in data["compute"]["cpu_fallbacks"]}
    assert counted == table
    assert "2 operators through DirectML's CPU fallback (4 calls" in result.err
    assert data["compute"]["device_share"] < 1.0
    report = tmp_path / "run.json"
    run = run_python(
        ["-m", "dmlpatch", "--device", "sim", f"--report={report}", "program.py"],
        cwd=tmp_path,
        env=clean_env(),
    )
    assert run.code == 0, run.err
    compute = json.loads(report.read_text())["compute"]
    assert {entry["operator"] for entry in compute["cpu_fallbacks"]} == table
    # An ordinary run counts layers: the program's products are none, so there is no share,
    # only the fallbacks, named.
    assert compute["device_share"] is None
    exit_line = next(line for line in run.err.splitlines() if "ran through DirectML's" in line)
    assert "aten::_linalg_svd.U (2 calls, 8 copies" in exit_line and "aten::histc" in exit_line


def test_refusal_without_a_fix_would_fail(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    result, data = _check(tmp_path, write, REFUSED)
    assert result.code == 1
    assert "DirectML scatter doesn't allow for index and source" in result.err  # traceback
    assert data["verdict"] == (
        "would fail: aten::scatter.src_out at program.py:7 (known failure scatter-src-shape; "
        "kernel: dmlpatch.opfix.tensors.scatter)"
    )
    assert data["status"] == "fails"
    assert [(r["op"], r["how"], r["calls"]) for r in data["ops"]] == [
        ("aten::scatter.src_out", "refused", 1),
        ("aten::hypot.out", "fallback", 1),
    ]


RECURRENT = """
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
lstm = torch.nn.LSTM(4, 8).to(device)
mask = torch.tensor([[1.0, 0.0]], device=device)
out, _ = lstm(torch.randn(3, 1, 4, device=device))
print(torch.isneginf((1.0 - mask) * torch.finfo(torch.float32).min).tolist())
"""

HELPER = """
import torch


@torch.inference_mode()
def predict(model, x):
    return model(x)
"""

INFERENCE = """
import torch
from helper import predict

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(3, 2).to(device)
print(predict(model, torch.ones(1, 3, device=device)))
"""


def test_fixed_rows_name_their_known_failures(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    result, data = _check(tmp_path, write, RECURRENT)
    assert result.code == 0, result.err
    known = {r["op"]: (r["how"], r["known_failure"]) for r in data["ops"]}
    assert known["aten::_thnn_fused_lstm_cell"] == ("fixed", "fused-rnn-cells")
    assert known["aten::isneginf.out"] == ("fixed", "isneginf")
    assert "fused-rnn-cells" in result.err  # the "known as" column


def test_a_refusal_is_named_by_its_text(tmp_path: Path, write: Callable[[str, str], Path]) -> None:
    write("helper.py", HELPER)
    # Outside --scope specs the helper's inference_mode is rewritten and the program runs.
    result, data = _check(tmp_path, write, INFERENCE)
    assert result.code == 0 and data["status"] == "runs", result.err
    result, data = _check(tmp_path, write, INFERENCE, "--scope", "specs")
    assert result.code == 1
    assert data["status"] == "fails"
    assert "(known failure inference-mode; rewrite: torch.inference_mode in the" in data["verdict"]
    refused = [r for r in data["ops"] if r["how"] == "refused"]
    assert [r["known_failure"] for r in refused] == ["inference-mode"]


# DirectML has no bfloat16, no complex type and, on some adapters, no float64: the simulated
# device stops a program there with the text below. dmlpatch may close such a gap on the device
# one day; where the program's operation then runs, it raises the simulator's text itself, so
# that what is tested stays check's recognition of the failure from the exception.
DTYPE_WALL = """
import sys
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.randn(8, device=device)
meets = {{
    "bfloat16": lambda: x.sum(dtype=torch.bfloat16),
    "complex": lambda: torch.complex(x, x),
    "float64": lambda: x.double() * 2,
}}
meets[sys.argv[1]]()
raise RuntimeError({said!r})
"""


@pytest.mark.parametrize("entry", ["bfloat16", "complex", "float64"])
def test_a_failure_is_named_by_its_exception(
    tmp_path: Path, write: Callable[[str, str], Path], entry: str
) -> None:
    from dmlpatch.gaps import catalogue, profiles

    said = {
        "bfloat16": profiles.UNSUPPORTED_DTYPE_TEXT.format(dtype="BFloat16"),
        "complex": profiles.UNSUPPORTED_DTYPE_TEXT.format(dtype="ComplexFloat"),
        "float64": catalogue.get("float64").text.split(": ", 1)[1],
    }[entry]
    script = write("program.py", DTYPE_WALL.format(said=said))
    report = tmp_path / "check.json"
    result = run_python(
        ["-m", "dmlpatch", "check", "--json", str(report), script.name, entry],
        cwd=script.parent,
        env=clean_env(DMLPATCH_SIM_FLOAT64="0"),
    )
    data = json.loads(report.read_text())
    assert result.code == 1, result.err
    assert (data["status"], data["known_failure"]) == ("fails", entry)
    assert f"(known failure {entry}; " in data["verdict"]
    assert f"RuntimeError: {said}" in result.err  # the program's own traceback, too


TRACES = """
import json, torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2)).to(device)
x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)).to(device)
traced = torch.jit.trace(model, x)  # as yolov5 does for TensorBoard's graph
print(json.dumps({"same": torch.equal(traced(x), model(x)), "device": str(x.device)}))
"""


def test_a_program_that_traces_its_model_runs_and_is_counted(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    """torch.jit.trace fails under any dispatch mode, and its recording run must not be
    counted (its shapes are traced values): check and an ordinary run both stay out of it."""
    result, data = _check(tmp_path, write, TRACES, "--device", "sim")
    assert result.code == 0 and data["status"] == "runs", result.err
    assert json.loads(result.out) == {"same": True, "device": "privateuseone:0"}
    # The two forwards the program ran after tracing: a conv and a linear each.
    assert data["compute"]["on_device"]["calls"] == 4
    assert data["compute"]["device_share"] == 1.0
    plain = run_python(
        ["-m", "dmlpatch", "--device", "sim", "--report=r.json", "program.py"],
        cwd=tmp_path,
        env=clean_env(),
    )
    assert plain.code == 0, plain.err
    assert json.loads(plain.out)["same"] is True
    assert "TracerWarning" not in plain.err
    assert json.loads((tmp_path / "r.json").read_text())["compute"]["device_share"] == 1.0


def test_the_programs_own_failures_keep_their_status(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    result, data = _check(tmp_path, write, "import sys\nsys.exit(3)\n")
    assert result.code == 3 and data["exit_code"] == 3 and data["status"] == "error"
    result, data = _check(tmp_path, write, "raise ValueError('bad input')\n")
    assert result.code == 1
    assert data["verdict"] == "the program failed for another reason: ValueError: bad input"
    assert "ValueError: bad input" in result.err


def test_profile_and_module_forms(tmp_path: Path, write: Callable[[str, str], Path]) -> None:
    write("noise/__init__.py", "")
    write(
        "noise/__main__.py",
        "import torch\nprint(torch.randn(3, device='privateuseone').sum() != 0)\n",
    )
    report = tmp_path / "m.json"
    result = run_python(
        [
            "-m",
            "dmlpatch",
            "check",
            "--profile",
            "pytorch-directml-1.8",
            "--json",
            str(report),
            "-m",
            "noise",
        ],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(tmp_path)),
    )
    assert result.code == 0, result.err
    data = json.loads(report.read_text())
    assert data["profile"] == "pytorch-directml-1.8"
    assert [(r["op"], r["how"]) for r in data["ops"]] == [("aten::normal_", "fixed")]
    write("x.py", "")
    bad = run_python(["-m", "dmlpatch", "check", "--profile", "nope", "x.py"], cwd=tmp_path)
    assert bad.code == 2 and "unknown simulated-device profile 'nope'" in bad.err


def test_verify_catches_a_dropped_write(tmp_path: Path, write: Callable[[str, str], Path]) -> None:
    result, data = _check(
        tmp_path, write, WRITE, "--verify", DMLPATCH_SIM_FAULT="drop-scalar-writes"
    )
    assert result.code == 1, result.err
    assert data["divergence"]["op"] == "aten::copy_"
    assert data["divergence"]["at"] == "program.py:5"
    assert data["verdict"].startswith("diverges from the CPU: aten::copy_ at program.py:5")
    clean, data = _check(tmp_path, write, WRITE, "--verify")
    assert clean.code == 0 and data["divergence"] is None and "8.0" in clean.out


def test_verify_has_no_false_positive_on_the_example_cnn(tmp_path: Path) -> None:
    report = tmp_path / "cnn.json"
    result = run_python(
        [
            "-m",
            "dmlpatch",
            "check",
            "--verify",
            "--json",
            str(report),
            str(REPO / "examples" / "train_cnn.py"),
            "--epochs",
            "1",
        ]
    )
    assert result.code == 0, result.err
    data = json.loads(report.read_text())
    assert data["divergence"] is None and data["status"] == "runs"


def test_a_json_file_that_cannot_be_written_is_exit_2(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    """Writable when check starts, gone when it ends: the verdict stands, the exit says the file
    a CI would read next is missing."""
    out = tmp_path / "out"
    out.mkdir()
    script = write("program.py", "import shutil, sys\nshutil.rmtree(sys.argv[1])\nprint('ran')\n")
    destination = out / "check.json"
    result = run_python(
        ["-m", "dmlpatch", "check", "--json", str(destination), script.name, str(out)],
        cwd=script.parent,
    )
    assert result.code == 2, result.err
    assert "ran" in result.out
    assert "no operator ran on the device" in result.out + result.err
    assert result.err_lines[-1] == (
        f"dmlpatch: error: cannot write {destination}: No such file or directory"
    )
    assert not out.exists()


def test_byte_counts_in_decimal_units() -> None:
    from dmlpatch.placement.summary import bytes_text

    cases = {0: "0 B", 999: "999 B", 1000: "1.0 kB", 1500: "1.5 kB", 999_999: "1.0 MB"}
    cases.update({2_500_000_000: "2.5 GB", 5 * 10**12: "5000.0 GB"})
    assert {n: bytes_text(n) for n in cases} == cases
