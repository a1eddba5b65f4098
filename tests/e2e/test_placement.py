"""Where model compute really ran: the runner's exit warning and report, ``dmlpatch check``'s
verdict, for programs whose model stayed on the CPU, mixed programs, data loading on the CPU,
and programs that ran wholly on the simulated device (which must stay silent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from support import REPO, clean_env, run_python

CHILD = str(REPO / "src" / "dmlpatch" / "startup" / "_child")

EXPLICIT_CPU = """
import torch
import torch.nn as nn
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                      nn.Linear(8 * 14 * 14, 10))
model = model.to("cpu")
x = torch.randn(4, 3, 16, 16, device="cpu")
print("sum", round(model(x).sum().item(), 3))
"""

LIBRARY = """
import torch


def pick():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""

UNREWRITTEN = """
import torch
import torch.nn as nn

import mylib

device = mylib.pick()
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4)).to(device)
for step in range(3):
    loss = model(torch.randn(16, 64, device=device)).square().mean()
    loss.backward()
print("on", next(model.parameters()).device)
"""

MIXED = """
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(32, 32).to(device)
y = model(torch.randn(8, 32, device=device))
a = torch.randn(256, 256)
big = a @ a
print("done", y.device, big.device)
"""

LOADING = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Blurred(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        image = torch.randn(1, 3, 64, 64)
        image = F.conv2d(image, torch.ones(3, 1, 5, 5) / 25, padding=2, groups=3)[0]
        colour = torch.randn(3, 3)
        return (colour @ image.reshape(3, -1)).reshape(3, 64, 64), i % 2


model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(4, 2)).to(device)
for x, y in DataLoader(Blurred(), batch_size=4):
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
print("loss", round(loss.item(), 3))
"""

FALLBACK = """
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.arange(5, device=device).float()
for step in range(3):
    y = torch.hypot(x, x + 1)
print("hypot", y.sum().item())
"""


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dmlpatch: warning:")]


def _run(
    tmp_path: Path, script: Path, *options: str, args: tuple[str, ...] = (), **env: str
) -> tuple[Any, dict[str, Any]]:
    """The script under the runner on the simulated device, ``args`` after it; its report."""
    report = tmp_path / "report.json"
    result = run_python(
        ["-m", "dmlpatch", "--device", "sim", f"--report={report}", *options, script.name, *args],
        cwd=script.parent,
        env=clean_env(**env),
    )
    return result, json.loads(report.read_text())


def _check(tmp_path: Path, script: Path, *options: str) -> tuple[Any, dict[str, Any]]:
    report = tmp_path / "check.json"
    result = run_python(
        ["-m", "dmlpatch", "check", *options, "--json", str(report), script.name],
        cwd=script.parent,
        env=clean_env(),
    )
    return result, json.loads(report.read_text())


# -- a model moved to the CPU explicitly --------------------------------------------------------


def test_explicit_cpu_model_is_named_at_exit_and_in_the_report(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", EXPLICIT_CPU)
    plain = run_python([script.name], cwd=tmp_path)
    result, report = _run(tmp_path, script)
    assert result.code == 0, result.err
    assert result.out == plain.out  # the program itself runs as it would
    (warning,) = _warnings(result.err)
    assert (
        "100% of model compute" in warning and "ran on the CPU, not on privateuseone:0" in warning
    )
    assert "(first at program.py:9 in <module>)" in warning
    assert 'an explicit CPU placement at program.py:7: model = model.to("cpu")' in warning
    assert warning.endswith("see: dmlpatch check program.py")
    assert (report["device"], report["backend"]) == ("privateuseone:0", "sim")
    compute = report["compute"]
    assert compute["counted"] == "layers" and compute["device_share"] == 0.0
    assert compute["on_device"] == {"calls": 0, "flops": 0}
    assert compute["on_cpu"]["calls"] == 3  # conv, batch norm, linear: one forward each
    (line,) = compute["cpu_lines"]
    assert line["at"] == f"{script}:9" and line["function"] == "<module>"
    assert line["families"] == ["convolution", "matmul", "normalization"]
    # 8x14x14 outputs of 27 multiply-adds, 10 outputs of 1568+1 weights, 5 FLOPs per element.
    assert line["flops"] == 4 * (2 * 8 * 14 * 14 * 27 + 2 * (10 * 1568 + 10) + 5 * 8 * 14 * 14)
    assert compute["likely_cause"] == {
        "kind": "explicit-cpu",
        "at": "program.py:7",
        "text": 'an explicit CPU placement at program.py:7: model = model.to("cpu")',
    }


def test_explicit_cpu_model_fails_check_with_the_line(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", EXPLICIT_CPU)
    result, data = _check(tmp_path, script)
    assert result.code == 1, result.err
    assert data["status"] == "cpu"
    assert data["verdict"].startswith("does not run on DirectML: 100% of model compute")
    assert "most at program.py:9 in <module>" in data["verdict"]
    assert "explicit CPU placement at program.py:7" in data["verdict"]
    assert data["compute"]["counted"] == "operators"
    assert "  no operator ran on the device" in result.err.splitlines()
    assert _warnings(result.err) == []  # check says it in its verdict, not in a warning


def test_quiet_keeps_the_warning_but_not_the_report(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", EXPLICIT_CPU)
    result, report = _run(tmp_path, script, DMLPATCH_QUIET="1")
    assert result.code == 0 and _warnings(result.err) == []
    assert report["compute"]["device_share"] == 0.0


def test_accounting_off(tmp_path: Path, write: Callable[[str, str], Path]) -> None:
    script = write("program.py", EXPLICIT_CPU)
    result, report = _run(tmp_path, script, DMLPATCH_ACCOUNTING="0")
    assert result.code == 0 and _warnings(result.err) == []
    assert report["compute"] is None


# -- a device chosen in a module dmlpatch did not rewrite ------------------------------------


@pytest.mark.parametrize("entry", ["runner", "auto", "activated"])
def test_device_chosen_in_an_unrewritten_module(
    tmp_path: Path, write: Callable[[str, str], Path], entry: str
) -> None:
    write("mylib.py", LIBRARY)
    script = write("train.py", UNREWRITTEN)
    report_path = tmp_path / "report.json"
    if entry == "runner":
        result, report = _run(tmp_path, script, "--scope", "specs")
    else:
        if entry == "auto":
            script.write_text("import dmlpatch.auto\n" + script.read_text())
        env = clean_env(
            DMLPATCH_DEVICE="sim", DMLPATCH_SCOPE="specs", DMLPATCH_REPORT=str(report_path)
        )
        if entry == "activated":  # what the .pth of `dmlpatch activate` runs, at start-up
            env["PYTHONPATH"] = CHILD
        result = run_python([script.name], cwd=tmp_path, env=env)
        report = json.loads(report_path.read_text())
    assert result.code == 0, result.err
    assert "on cpu" in result.out
    assert not any("running on privateuseone" in line for line in result.err.splitlines())
    (warning,) = _warnings(result.err)
    shift = 1 if entry == "auto" else 0
    assert f"(first at train.py:{9 + shift} in <module>)" in warning
    assert "the device is chosen at mylib.py:5" in warning
    assert "in module mylib, which dmlpatch did not rewrite: outside scope 'specs'" in warning
    assert (report["device"], report["backend"]) == ("privateuseone:0", "sim")
    assert report["compute"]["device_share"] == 0.0
    assert report["compute"]["likely_cause"]["at"] == "mylib.py:5"


def test_check_names_the_unrewritten_module(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    write("mylib.py", LIBRARY)
    script = write("train.py", UNREWRITTEN)
    result, data = _check(tmp_path, script, "--scope", "specs")
    assert result.code == 1, result.err
    assert data["status"] == "cpu"
    assert "the device is chosen at mylib.py:5" in data["verdict"]
    lines = {line["display"] for line in data["compute"]["cpu_lines"]}
    # The forward on line 9 and the backward on line 10 (autograd runs CPU work in place).
    assert lines == {"train.py:9 in <module>", "train.py:10 in <module>"}
    # With discovery on (the default), the same program runs on the device.
    result, data = _check(tmp_path, script)
    assert result.code == 0, result.err
    assert data["status"] == "runs" and data["compute"]["device_share"] == 1.0


# -- model on the device, a large product on the CPU ------------------------------------------


def test_mixed_program_names_the_cpu_product(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", MIXED)
    result, data = _check(tmp_path, script)
    assert result.code == 1, result.err
    compute = data["compute"]
    (line,) = compute["cpu_lines"]
    assert (line["display"], line["families"]) == ("program.py:8 in <module>", ["matmul"])
    assert line["flops"] == 2 * 256**3
    assert compute["on_device"] == {"calls": 1, "flops": 2 * 8 * 32 * 32}
    assert compute["device_share"] == round(8 * 32 * 32 / (8 * 32 * 32 + 256**3), 4)
    assert "most at program.py:8 in <module>" in data["verdict"]
    assert compute["likely_cause"]["kind"] == "chosen-at-run-time"


# -- data loading on the CPU is not model compute ---------------------------------------------


def test_data_loading_on_the_cpu_is_not_model_compute(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", LOADING)
    result, data = _check(tmp_path, script)
    assert result.code == 0, result.err
    assert data["status"] == "runs"
    compute = data["compute"]
    assert compute["on_cpu"] == {"calls": 0, "flops": 0} and compute["device_share"] == 1.0
    # 16 samples, each a blur and a colour product, in the DataLoader's fetch.
    assert compute["data_loading_on_cpu"]["calls"] == 32
    assert compute["on_device"]["calls"] > 0
    run, report = _run(tmp_path, script)
    assert run.code == 0 and _warnings(run.err) == []
    assert report["compute"]["device_share"] == 1.0


# -- the report counts DirectML's fallback copies ---------------------------------------------


def test_report_counts_fallback_copies_apart_from_the_programs(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", FALLBACK)
    result, report = _run(tmp_path, script)
    assert result.code == 0, result.err
    transfers = report["transfers"]
    # Each hypot call copies both arguments to the host and its result back.
    assert transfers["fallback"] == {
        "count": 9,
        "bytes": 180,
        "by_operator": {"aten::hypot.out": {"count": 9, "bytes": 180}},
    }
    assert transfers["program"]["h2d"]["count"] == 0  # arange and + ran on the device
    assert transfers["syncs"] == 1  # .item()
    # No layer ran, but the fallback's work is compute on the CPU: by the elements hypot read
    # and wrote (3 calls of two 5-element inputs and a 5-element result), with its copies. No
    # share is given: the device's work (arange, +) is no layer's, and 0.0 would say that
    # nothing ran there.
    compute = report["compute"]
    assert compute["device_share"] is None
    assert compute["on_cpu"] == {"calls": 3, "flops": 3 * 15}
    (fallback,) = compute["cpu_fallbacks"]
    assert fallback["operator"] == "aten::hypot.out" and fallback["calls"] == 3
    assert (fallback["copies"], fallback["bytes"]) == (9, 180)
    assert fallback["estimated_by"] == "elements" and fallback["flops"] == 3 * 15
    assert fallback["at"] == "program.py:6 in <module>"
    # The run names it at exit, with its copies; no layer ran, so nothing to warn about.
    assert _warnings(result.err) == []
    said = "dmlpatch: ran through DirectML's CPU fallback: aten::hypot.out (3 calls, 9 copies, "
    assert any(line.startswith(said + "180 B); see: dmlpatch check") for line in result.err_lines)


def test_report_says_why_a_torch_free_program_has_no_device(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", "print('no torch here')\n")
    result, report = _run(tmp_path, script)
    assert result.code == 0, result.err
    assert (report["device"], report["backend"], report["compute"]) == (None, None, None)
    assert report["why"] == "the program never imported torch, so no device was selected"
    assert _warnings(result.err) == []


# -- a forward while a module is being built is set-up, not model compute ---------------------

PROBED = """
import sys

import torch
import torch.nn as nn


class Probed(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())
        self.stride = 64 // self.body(torch.zeros(1, 3, 64, 64)).shape[-1]  # a shape probe

    def forward(self, x):
        return self.body(x)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Probed()
if sys.argv[1:] == ["place"]:
    model = model.to(device)
for step in range(2):
    model(torch.randn(2, 3, 32, 32, device=next(model.parameters()).device)).sum().backward()
print("stride", model.stride)
"""


@pytest.mark.parametrize("placed", [True, False])
def test_a_shape_probe_while_building_is_not_model_compute(
    tmp_path: Path, write: Callable[[str, str], Path], placed: bool
) -> None:
    script = write("program.py", PROBED)
    result, report = _run(tmp_path, script, args=("place",) if placed else ())
    assert result.code == 0, result.err
    compute = report["compute"]
    assert compute["model_setup_on_cpu"]["calls"] == 2  # the probe's conv and batch norm
    if placed:
        assert compute["device_share"] == 1.0 and _warnings(result.err) == []
        assert compute["on_device"]["calls"] == 4
    else:  # the same layers, probed while built and then run for real on the CPU
        assert compute["device_share"] == 0.0 and compute["on_cpu"]["calls"] == 4
        (warning,) = _warnings(result.err)
        assert "(first at program.py:14 in forward)" in warning
    if not placed:  # check runs the program without arguments: the CPU case
        checked, data = _check(tmp_path, script)
        assert checked.code == 1 and data["status"] == "cpu"
        assert data["compute"]["model_setup_on_cpu"]["calls"] == 2


# -- compute a CPU fallback ran on device tensors ---------------------------------------------

# Heavy operators DirectML 0.2.5 runs through its CPU fallback: attention's inference fast path,
# a dot product and a batched sum of products. dmlpatch's fixes bring the first two onto the
# device (the dot's float32 rounding then differs from the CPU's in the last place printed
# before, so it is printed whole): the tests read which ones fell back from the run itself.
HEAVY_FALLBACKS = """
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
attention = nn.MultiheadAttention(64, 4, batch_first=True).to(device).eval()
x = torch.randn(4, 48, 64, device=device)
v = torch.randn(50000, device=device)
b = torch.randn(16, 64, 64, device=device)
with torch.no_grad():
    y, _ = attention(x, x, x, need_weights=False)
    d = torch.dot(v, v)
    s = torch.addbmm(torch.zeros(64, 64, device=device), b, b)
print("sums", round(y.sum().item(), 2), round(d.item()), round(s.sum().item(), 1))
"""

# Lines of HEAVY_FALLBACKS' operators, by operator.
FALLBACK_LINES = {
    "aten::_native_multi_head_attention": 11,
    "aten::dot": 12,
    "aten::addbmm": 13,
}


def _heavy(operators: dict[str, int]) -> set[str]:
    from dmlpatch.placement import families

    return {op for op in operators if families.operator_family(op.partition("::")[2].split(".")[0])}


def test_check_counts_what_cpu_fallbacks_ran_as_cpu_compute(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", HEAVY_FALLBACKS)
    plain = run_python([script.name], cwd=tmp_path)
    result, data = _check(tmp_path, script)
    assert result.out == plain.out
    fell_back = _heavy({row["op"]: row["calls"] for row in data["ops"] if row["how"] == "fallback"})
    assert fell_back, "no heavy operator falls back any more: pick another for this test"
    compute = data["compute"]
    named = {entry["operator"]: entry for entry in compute["cpu_fallbacks"]}
    assert set(named) == fell_back
    for operator, entry in named.items():
        assert entry["at"].startswith(f"program.py:{FALLBACK_LINES[operator]} ")
        assert entry["flops"] > 0
    share = compute["device_share"]
    assert share is not None and share < 1.0
    assert sum(e["flops"] for e in named.values()) == compute["on_cpu"]["flops"]
    # The 10% rule sees it.
    assert result.code == (1 if 1.0 - share >= 0.1 else 0), result.err
    if result.code:
        assert compute["likely_cause"]["kind"] == "fallback"
        assert "its CPU fallback ran it" in data["verdict"]
    # DirectML's warning names the program's line, not dmlpatch's dispatch mode.
    warned = [line for line in result.err.splitlines() if "UserWarning: The operator" in line]
    assert warned and all(line.startswith(f"{script}:") for line in warned), result.err


def test_ordinary_runs_count_cpu_fallbacks_by_operator(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", HEAVY_FALLBACKS)
    plain = run_python([script.name], cwd=tmp_path)
    result, report = _run(tmp_path, script)
    assert result.code == 0, result.err
    assert result.out == plain.out
    fell_back = _heavy(report["ops"]["fallback"])
    assert fell_back, "no heavy operator falls back any more: pick another for this test"
    compute = report["compute"]
    assert compute["counted"] == "layers"
    assert {e["operator"] for e in compute["cpu_fallbacks"]} == fell_back
    assert compute["device_share"] < 1.0
    # What the fallbacks copied is theirs, not the program's: the program copied its model and
    # inputs to the device and nothing back.
    assert report["transfers"]["program"]["d2h"]["count"] == 0
    assert report["transfers"]["fallback"]["count"] > 0
    for operator in fell_back:
        expected = f"{script}:{FALLBACK_LINES[operator]}: UserWarning: The operator '{operator}'"
        assert any(line.startswith(expected) for line in result.err.splitlines()), result.err


CONVOLUTIONS = """
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)).to(device)
y = net(torch.randn(4, 3, 32, 32, device=device))
y.square().mean().backward()
print("sums", round(y.sum().item(), 3), round(net[0].weight.grad.sum().item(), 3))
"""


def test_cpu_ops_sends_the_convolution_to_the_cpu_counted(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    script = write("program.py", CONVOLUTIONS)
    plain = run_python([script.name], cwd=tmp_path)
    result, report = _run(tmp_path, script, DMLPATCH_CPU_OPS="aten::convolution_overrideable")
    assert result.code == 0, result.err
    assert result.out == plain.out
    assert report["ops"]["fallback"] == {"aten::convolution_overrideable": 2}
    compute = report["compute"]
    assert compute["device_share"] == 0.0  # both convolutions' forward ran on the CPU
    assert compute["likely_cause"]["kind"] == "cpu-ops"
    (line,) = compute["cpu_lines"]
    assert line["at"] == f"{script}:7"
    assert line["fallbacks"] == ["aten::convolution_overrideable"]
    assert "UserWarning" not in result.err  # the user asked for it: no DirectML warning


# -- what a program is told, under every entry point -------------------------------------------

PLAIN_CPU = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(16, 32)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", round(loss.item(), 4))
"""

CUDA_STYLE = """
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(8, 2).to(device)
print("on", model(torch.randn(4, 8, device=device)).device)
"""


def _entry(tmp_path: Path, script: Path, entry: str) -> Any:
    """The script under the runner, ``import dmlpatch.auto`` or an activated environment."""
    if entry == "runner":
        return run_python(["-m", "dmlpatch", "--device", "sim", script.name], cwd=tmp_path)
    if entry == "auto":
        script.write_text("import dmlpatch.auto\n" + script.read_text())
    env = clean_env(DMLPATCH_DEVICE="sim")
    if entry == "activated":  # what the .pth of `dmlpatch activate` runs, at start-up
        env["PYTHONPATH"] = CHILD
    return run_python([script.name], cwd=tmp_path, env=env)


@pytest.mark.parametrize("entry", ["runner", "auto", "activated"])
def test_a_program_that_never_asks_for_cuda_is_told_nothing(
    tmp_path: Path, write: Callable[[str, str], Path], entry: str
) -> None:
    script = write("train.py", PLAIN_CPU)
    plain = run_python([script.name], cwd=tmp_path)
    result = _entry(tmp_path, script, entry)
    assert result.code == 0, result.err
    assert result.out == plain.out
    assert result.err == ""


@pytest.mark.parametrize("entry", ["runner", "auto", "activated"])
def test_the_running_line_is_the_same_under_every_entry_point(
    tmp_path: Path, write: Callable[[str, str], Path], entry: str
) -> None:
    script = write("train.py", CUDA_STYLE)
    result = _entry(tmp_path, script, entry)
    assert result.code == 0, result.err
    assert result.out == "on privateuseone:0\n"
    assert result.err_lines == [
        "dmlpatch: running on privateuseone:0 (Simulated Radeon (discrete)): requested sim: "
        "simulated DirectML device, profile torch-directml-0.2.5"
    ]
