"""A program's CUDA mixed precision on the simulated DirectML device, run as a user runs it.

The program is written for CUDA (``torch.autocast("cuda")``, ``torch.cuda.amp.GradScaler()``)
and falls back to the CPU without it. Under ``python -m dmlpatch --device sim`` it trains in
float16 on the device with a GradScaler there; its losses match the CPU's float32 run within
float16's tolerance, step by step, and the CPU's own float16 autocast run likewise. Under
``--device cpu`` it runs exactly as under plain python.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import clean_env, run_python

PROGRAM = """
import json, sys
import torch
from torch import nn

torch.manual_seed(0)
mode = sys.argv[1] if len(sys.argv) > 1 else "cuda"
cuda = torch.cuda.is_available()
device = torch.device("cuda" if cuda else "cpu")
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
    nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    nn.Linear(16, 10),
).to(device)
seen = []
model[0].register_forward_hook(lambda module, inputs, output: seen.append(str(output.dtype)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.cuda.amp.GradScaler(enabled=cuda)
x = torch.randn(8, 3, 16, 16).to(device)
y = torch.randint(0, 10, (8,)).to(device)
if mode == "cuda":
    region = lambda: torch.autocast("cuda", enabled=cuda)
else:  # the CPU's own float16 autocast
    region = lambda: torch.autocast("cpu", dtype=torch.float16)
losses, scales = [], []
for step in range(6):
    optimizer.zero_grad()
    with region():
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
    scaler.scale(loss).backward()
    if step == 3:  # an overflow, as float16 training meets one
        for p in model.parameters():
            p.grad.fill_(float("inf"))
            break
    before = model[-1].weight.detach().clone()
    scaler.step(optimizer)
    scaler.update()
    skipped = bool(torch.equal(before, model[-1].weight.detach()))
    losses.append(loss.item())
    scales.append([scaler.get_scale(), skipped])
print(json.dumps({"losses": losses, "scales": scales, "dtypes": sorted(set(seen)),
                  "output": str(out.dtype), "loss": str(loss.dtype)}))
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(PROGRAM)
    return tmp_path


def _run(program: Path, *args: str, mode: str = "cuda") -> tuple[dict, list[str]]:
    result = run_python([*args, "train.py", mode], cwd=program)
    assert result.code == 0, result.err
    return json.loads(result.out), result.err_lines


def test_the_cuda_program_trains_in_float16_on_the_device(program: Path) -> None:
    on_device, said = _run(program, "-m", "dmlpatch", "--device", "sim")
    cpu, _ = _run(program)
    assert cpu["dtypes"] == ["torch.float32"] and cpu["scales"][0] == [1.0, False]
    assert on_device["dtypes"] == ["torch.float16"]
    assert (on_device["output"], on_device["loss"]) == ("torch.float16", "torch.float32")
    # CUDA's scaler: 2**16, halved at the overflow, whose step is skipped; no other step is
    steps = [skipped for _, skipped in on_device["scales"]]
    assert steps == [False, False, False, True, False, False]
    assert [scale for scale, _ in on_device["scales"]] == [65536.0] * 3 + [32768.0] * 3
    # Loss by loss, the float32 run (whose disabled scaler lets the infinite step through:
    # the steps before it) ...
    assert on_device["losses"][:4] == pytest.approx(cpu["losses"][:4], rel=2e-3)
    # ... and the skipped step changed nothing: the next forward is the same
    assert on_device["losses"][4] == on_device["losses"][3]
    assert (
        "dmlpatch: mixed precision: autocast computes in float16 on privateuseone:0 with "
        "CUDA's operator lists" in said
    )


def test_the_device_s_losses_follow_the_cpu_s_float16_autocast(program: Path) -> None:
    """The CPU's float16 autocast (its lists differ from CUDA's: loosely)."""
    on_device, _ = _run(program, "-m", "dmlpatch", "--device", "sim")
    cpu16, _ = _run(program, mode="cpu16")
    assert cpu16["dtypes"] == ["torch.float16"]
    assert on_device["losses"][:4] == pytest.approx(cpu16["losses"][:4], rel=5e-3)


def test_with_device_cpu_autocast_and_the_scaler_are_as_written(program: Path) -> None:
    plain = run_python(["train.py"], cwd=program)
    patched = run_python(["-m", "dmlpatch", "--device", "cpu", "train.py"], cwd=program)
    assert plain.code == patched.code == 0, patched.err
    assert patched.out == plain.out


FLAGS = """
import torch
m = torch.nn.Linear(4, 4).cuda()
x = torch.randn(2, 4).cuda()

@torch.cuda.amp.autocast()
def forward(x):
    return m(x).dtype, torch.is_autocast_enabled(), torch.get_autocast_dtype("cuda")

print(*forward(x), torch.is_autocast_enabled())
with torch.autocast("cuda"):
    with torch.autocast("cuda", enabled=False):
        print(m(x).dtype, torch.is_autocast_enabled())
    print(m(x).dtype, torch.is_autocast_enabled())
with torch.autocast("cuda", dtype=torch.bfloat16):
    print(m(x).dtype)
with torch.autocast("cuda", dtype=torch.float64):
    print(m(x).dtype)
with torch.autocast(device_type="dml"):
    print(m(x).dtype)
"""


@pytest.mark.parametrize("bf16", ["", "float16"])
def test_regions_answer_as_on_cuda_and_bfloat16_is_decided(tmp_path: Path, bf16: str) -> None:
    """Inside a region written for CUDA, CUDA's autocast reads as on (the question a program
    asks without naming a device is CUDA's); nested and disabled regions, the decorator; a
    bfloat16 region runs in float32 (or float16 when asked), float64 in float32, said once."""
    (tmp_path / "flags.py").write_text(FLAGS)
    env = clean_env(DMLPATCH_BF16=bf16) if bf16 else clean_env()
    result = run_python(["-m", "dmlpatch", "--device", "sim", "flags.py"], cwd=tmp_path, env=env)
    assert result.code == 0, result.err
    bf16_dtype = "torch.float16" if bf16 else "torch.float32"
    assert result.out.splitlines() == [
        "torch.float16 True torch.float16 False",
        "torch.float32 False",
        "torch.float16 True",
        bf16_dtype,
        "torch.float32",
        "torch.float16",
    ]
    lines = result.err_lines
    if bf16:
        assert any("bfloat16 autocast computes in float16 on DirectML" in line for line in lines)
    else:
        assert (
            "dmlpatch: DirectML has no bfloat16 arithmetic: the program's bfloat16 autocast runs "
            "in float32 (DMLPATCH_BF16=float16 runs it in float16)" in lines
        )
    assert (
        "dmlpatch: warning: autocast to torch.float64: DirectML's autocast computes in float16 "
        "only; the region runs without autocast" in lines
    )


CPU_MODEL = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
plain = sys.argv[1] == "plain"
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))  # stays on the CPU
head = nn.Linear(1, 1)
if sys.argv[1] == "mixed":  # the head on the device
    head = head.to("cuda")
optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
# 1024: the float16 head's gradients stay finite, so no step is skipped on either side
scaler = (
    torch.amp.GradScaler("cpu", init_scale=1024.0)
    if plain
    else torch.cuda.amp.GradScaler(init_scale=1024.0)
)
x = torch.randn(4, 8)
for step in range(3):
    optimizer.zero_grad()
    with torch.autocast("cuda", enabled=not plain):
        out = model(x)
        loss = head(out.to(head.weight.device)).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"{loss.item():.6f} {scaler.get_scale()} {out.dtype}")
"""


@pytest.mark.parametrize("placement", ["cpu", "mixed"])
def test_a_scaler_over_cpu_parameters_behaves_as_torch_s(tmp_path: Path, placement: str) -> None:
    """A CUDA GradScaler given a CPU model (or one split between the CPU and the device): the
    scaler works on whichever device each gradient is, as torch's does on a CUDA machine; the
    CPU's part is not autocast (a CUDA region casts CUDA tensors only). Its losses are a CPU
    run's with the CPU's own GradScaler (the device's float16 head: within its rounding)."""
    (tmp_path / "cpu_model.py").write_text(CPU_MODEL)
    patched = run_python(
        ["-m", "dmlpatch", "--device", "sim", "cpu_model.py", placement], cwd=tmp_path
    )
    plain = run_python(["cpu_model.py", "plain"], cwd=tmp_path)
    assert patched.code == plain.code == 0, patched.err + plain.err
    rows = [line.split() for line in patched.out.splitlines()]
    expected = [line.split() for line in plain.out.splitlines()]
    assert [row[1:] for row in rows] == [row[1:] for row in expected]  # scale 1024, float32
    for row, want in zip(rows, expected):
        rel = 1e-6 if placement == "cpu" else 2e-3
        assert float(row[0]) == pytest.approx(float(want[0]), rel=rel)


CUSTOM_FUNCTIONS = """
import json
import torch
from torch.cuda.amp import custom_bwd, custom_fwd

seen = []


class Float32Norm(torch.autograd.Function):  # a sensitive op, kept out of float16
    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, x, weight):
        seen.append(["norm", str(x.dtype), str(weight.dtype), torch.is_autocast_enabled()])
        ctx.save_for_backward(x, weight)
        return x / x.norm(dim=1, keepdim=True) * weight

    @staticmethod
    @torch.cuda.amp.custom_bwd
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
            out = x / x.norm(dim=1, keepdim=True) * weight
        return torch.autograd.grad(out, (x, weight), grad)


class Project(torch.autograd.Function):  # runs under the caller's autocast, both ways
    @staticmethod
    @custom_fwd
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        out = x @ weight
        seen.append(["project", str(x.dtype), str(out.dtype), torch.is_autocast_enabled()])
        return out

    @staticmethod
    @custom_bwd
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight.t()  # float16 against float32: autocast must be on here
        seen.append(["project backward", str(grad_x.dtype), torch.is_autocast_enabled()])
        return grad_x, x.t() @ grad


def run(device, autocast):
    torch.manual_seed(0)
    x = torch.randn(8, 16, device=device, requires_grad=True)
    w1 = torch.randn(16, 16, device=device, requires_grad=True)
    w2 = torch.randn(16, device=device, requires_grad=True)
    with torch.autocast("cuda", enabled=autocast):
        out = Float32Norm.apply(Project.apply(x, w1), w2)
    out.float().square().sum().backward()
    return [t.grad.float().cpu() for t in (x, w1, w2)]


device = "cuda" if torch.cuda.is_available() else "cpu"
grads = run(device, True)
expected = run("cpu", False)
gap = max(float(((g - e).abs().max() / e.abs().max())) for g, e in zip(grads, expected))
print(json.dumps({"seen": seen[:3], "gap": gap}))
"""


def test_custom_autograd_functions_cast_as_on_cuda(tmp_path: Path) -> None:
    """``torch.cuda.amp``'s custom_fwd / custom_bwd, bare, called and imported: a forward with
    ``cast_inputs=torch.float32`` computes in float32 with autocast off, a bare one under the
    caller's region, and its backward under the same region (float16 gradients meet float32
    weights there, which fails without it); gradients follow the CPU's float32 ones."""
    (tmp_path / "functions.py").write_text(CUSTOM_FUNCTIONS)
    result = run_python(["-m", "dmlpatch", "--device", "sim", "functions.py"], cwd=tmp_path)
    assert result.code == 0, result.err
    found = json.loads(result.out)
    assert found["seen"] == [
        ["project", "torch.float32", "torch.float16", True],
        ["norm", "torch.float32", "torch.float32", False],
        ["project backward", "torch.float16", True],
    ]
    assert found["gap"] < 5e-3
    plain = run_python(["functions.py"], cwd=tmp_path)  # no CUDA: autocast("cuda") is off
    assert plain.code == 0, plain.err
    assert json.loads(plain.out)["seen"][0] == ["project", "torch.float32", "torch.float32", False]
