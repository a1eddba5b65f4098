"""Programs that make the optimizer before the model moves, run unmodified under dmlpatch on the
simulated device against plain python on the CPU, loss by loss (catalogue entry
``parameters-replaced``).

PyTorch replaces every Parameter that moves to a PrivateUse1 device, so before dmlpatch kept
them, each of these trained nothing on DirectML (the same loss every step after the first) and
GPT-2's head came apart from its embedding, with no error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import run_python

GPT2 = """
import json
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32)
model = GPT2LMHeadModel(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model.to(device)
ids = torch.randint(0, 100, (2, 16), device=device)
losses = []
for _ in range(4):
    loss = model(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
head, embedding = model.lm_head.weight, model.transformer.wte.weight
print(json.dumps({
    "losses": losses,
    "tied": head is embedding,
    "device": str(head.device),
}))
"""

ACCELERATE = """
import json
import torch
from accelerate import Accelerator

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses = []
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
print(json.dumps({
    "losses": losses,
    "device": str(accelerator.device),
    "parameters": sorted({str(p.device) for p in model.parameters()}),
}))
"""

# The CUDA-era order of a hand-written script: build, optimizer, then .cuda().
CUDA_ERA = """
import json
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
use_cuda = torch.cuda.is_available()
if use_cuda:
    model.cuda()
images, labels = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))
losses = []
for step in range(5):
    inputs, targets = (images.cuda(), labels.cuda()) if use_cuda else (images, labels)
    optimizer.zero_grad()
    loss = criterion(model(inputs), targets)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "device": str(next(model.parameters()).device)}))
"""


def _run(tmp_path: Path, source: str, *runner: str) -> dict[str, object]:
    (tmp_path / "program.py").write_text(source)
    result = run_python([*runner, "program.py"], cwd=tmp_path, timeout=600)
    assert result.code == 0, result.err
    found: dict[str, object] = json.loads(result.out.strip().splitlines()[-1])
    return found


def _compare(tmp_path: Path, source: str) -> tuple[dict[str, object], dict[str, object]]:
    plain = _run(tmp_path, source)
    patched = _run(tmp_path, source, "-m", "dmlpatch", "--device", "sim")
    on_cpu, on_device = plain["losses"], patched["losses"]
    assert isinstance(on_cpu, list) and isinstance(on_device, list)
    assert on_device == pytest.approx(on_cpu, rel=1e-5, abs=1e-6)
    assert len(set(on_cpu)) == len(on_cpu)  # it trains: no two steps have the same loss
    return plain, patched


def test_a_gpt2_moved_after_its_optimizer_trains_tied_as_on_the_cpu(tmp_path: Path) -> None:
    plain, patched = _compare(tmp_path, GPT2)
    assert plain["device"] == "cpu" and patched["device"] == "privateuseone:0"
    assert plain["tied"] is True and patched["tied"] is True


def test_an_accelerate_loop_trains_as_on_the_cpu(tmp_path: Path) -> None:
    plain, patched = _compare(tmp_path, ACCELERATE)
    assert plain["device"] == "cpu"
    assert patched["device"] == "privateuseone:0"
    assert patched["parameters"] == ["privateuseone:0"]


def test_a_script_that_calls_cuda_after_making_its_optimizer_trains(tmp_path: Path) -> None:
    plain, patched = _compare(tmp_path, CUDA_ERA)
    assert plain["device"] == "cpu" and patched["device"] == "privateuseone:0"
