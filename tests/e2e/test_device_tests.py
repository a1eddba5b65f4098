"""A CUDA-era training script that tests the device it got, run unmodified under dmlpatch on the
simulated device against plain python on the CPU, loss by loss.

Before dmlpatch rewrote tests of the device, ``if args.device == "cuda": model.cuda()`` was
false on DirectML (the literal became ``privateuseone:0``, the comparison did not), so the
model stayed on the CPU while the batches moved: the program stopped on mixed devices, and a
script that moved both the same way ran on the CPU while dmlpatch said it ran on the device.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import clean_env, run_python

PROGRAM = """
import argparse
import json
import os

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
if args.device == "cuda" or args.device.startswith("cuda:"):
    model.cuda()
device = next(model.parameters()).device
if device.type == "cuda":
    torch.backends.cudnn.benchmark = True
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
scale = {"cuda": 1.0, "cpu": 0.5}[device.type]
env_device = os.environ.get("PROGRAM_DEVICE", "cpu")
inputs, labels = torch.randn(12, 6), torch.randint(0, 3, (12,))
losses = []
for _ in range(args.steps):
    x = inputs.to(args.device, non_blocking=device.type == "cuda")
    y = labels.to(env_device)
    loss = nn.functional.cross_entropy(model(x) * scale, y.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(json.dumps({
    "losses": losses,
    "device": str(device),
    "is_cuda": x.is_cuda,
    "labels_from_env": str(y.device),
    "scale": scale,
}))
"""


def _run(tmp_path: Path, *args: str, env: dict[str, str]) -> dict[str, object]:
    (tmp_path / "train.py").write_text(PROGRAM)
    result = run_python([*args], cwd=tmp_path, env=clean_env(**env))
    assert result.code == 0, result.err
    found: dict[str, object] = json.loads(result.out.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], {"PROGRAM_DEVICE": "cuda"}),
        (["--device", "cuda:0"], {"PROGRAM_DEVICE": "cuda:0"}),
    ],
    ids=["default", "typed-on-the-command-line"],
)
def test_a_script_that_tests_its_device_trains_on_the_device_as_on_cuda(
    tmp_path: Path, argv: list[str], env: dict[str, str]
) -> None:
    plain = _run(tmp_path, "train.py", "--device", "cpu", env={})
    patched = _run(tmp_path, "-m", "dmlpatch", "--device", "sim", "train.py", *argv, env=env)
    assert patched["device"] == "privateuseone:0"
    assert patched["labels_from_env"] == "privateuseone:0"
    assert patched["is_cuda"] is True and patched["scale"] == 1.0
    assert plain["device"] == "cpu" and plain["scale"] == 0.5
    # The CUDA branch scales the logits by 1.0 and the CPU's by 0.5: compare with a CPU run of
    # the CUDA branch's arithmetic, which is the same program with scale 1.0.
    cuda_branch = _run(tmp_path, "-c", _AS_ON_CUDA, env={})
    assert patched["losses"] == pytest.approx(cuda_branch["losses"], rel=1e-5)
    assert len(set(patched["losses"])) == len(patched["losses"])  # it trains


def test_under_device_cpu_every_test_answers_as_plain_python(tmp_path: Path) -> None:
    plain = _run(tmp_path, "train.py", "--device", "cpu", env={})
    patched = _run(
        tmp_path, "-m", "dmlpatch", "--device", "cpu", "train.py", "--device", "cpu", env={}
    )
    assert patched == plain


# The program's CUDA branch (scale 1.0) on the CPU: what CUDA would compute.
_AS_ON_CUDA = (
    "import sys; sys.argv = ['train.py', '--device', 'cpu']; "
    "src = open('train.py').read().replace('\"cpu\": 0.5', '\"cpu\": 1.0'); "
    "exec(compile(src, 'train.py', 'exec'))"
)
