"""An ``Accelerator()`` training loop as accelerate's docs write it, on the simulated device
against the same loop on the CPU, loss by loss: ``prepare`` (model and optimizer made on the
CPU first), ``accelerator.autocast()``, ``accelerator.backward``, ``gather``, ``save_state`` and
``load_state``; ``mixed_precision`` "no", "fp16" and "bf16" (DirectML has no AMP: float32, said
once; before the accelerate spec, "fp16" stopped with ``ValueError: fp16 mixed precision
requires a device in (...) (not 'privateuseone')``), directly and through ``accelerate
launch``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import run_python

PROGRAM = """
import json, sys
import torch
from accelerate import Accelerator

mixed, state = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
accelerator = Accelerator() if mixed == "launched" else Accelerator(mixed_precision=mixed)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses = []
for x, y in loader:
    with accelerator.autocast():
        loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(accelerator.gather(loss.detach()).item())
accelerator.save_state(state)
trained = [p.detach().cpu().clone() for p in model.parameters()]
with torch.no_grad():
    for parameter in model.parameters():
        parameter.zero_()
accelerator.load_state(state)
print(json.dumps({
    "losses": losses,
    "device": str(accelerator.device),
    "parameters": sorted({str(p.device) for p in model.parameters()}),
    "restored": all(torch.equal(p.detach().cpu(), t) for p, t in zip(model.parameters(), trained)),
}))
"""

AMP_LINE = "dmlpatch: warning: DirectML has no mixed precision (AMP)"


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    where = tmp_path_factory.mktemp("cpu")
    (where / "train.py").write_text(PROGRAM)
    result = run_python(["train.py", "no", str(where / "state")], cwd=where)
    assert result.code == 0, result.err[-3000:]
    found = json.loads(result.out.strip().splitlines()[-1])
    assert found["device"] == "cpu" and found["restored"] is True
    losses: list[float] = found["losses"]
    return losses


@pytest.mark.parametrize("mixed", ["no", "fp16", "bf16", "launched"])
def test_an_accelerate_loop_trains_on_the_device_as_on_the_cpu(
    tmp_path: Path, on_cpu: list[float], mixed: str
) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    program = ["train.py", mixed, str(tmp_path / "state")]
    if mixed == "launched":  # accelerate launch --mixed_precision fp16, one process
        launcher = ["-m", "accelerate.commands.launch", "--num_processes", "1"]
        launcher += ["--num_machines", "1", "--mixed_precision", "fp16", "--dynamo_backend", "no"]
        program = [*launcher, *program]
    result = run_python(["-m", "dmlpatch", "--device", "sim", *program], cwd=tmp_path, timeout=600)
    assert result.code == 0, result.err[-3000:]
    found = json.loads(result.out.strip().splitlines()[-1])
    assert found["device"] == "privateuseone:0"
    assert found["parameters"] == ["privateuseone:0"]
    assert found["restored"] is True
    assert found["losses"] == pytest.approx(on_cpu, rel=1e-5, abs=1e-6)
    said = [line for line in result.err.splitlines() if line.startswith(AMP_LINE)]
    assert len(said) == (0 if mixed == "no" else 1)
