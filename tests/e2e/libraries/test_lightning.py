"""PyTorch Lightning on the simulated device, against the same program on the CPU, loss by loss.

Lightning's CUDA accelerator checks the device it gets (``device.type != "cuda"``: raise), keeps
the optimizer Lightning made before moving the module, and moves the module back to the CPU
after ``fit``. Before dmlpatch rewrote tests of the device and kept parameters across moves,
``accelerator="auto"`` turned a program that trains on the CPU under plain python into
``MisconfigurationException: Device should be GPU, got privateuseone:0 instead``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import REPO, clean_env, run_python

TRAINER = """
import json, os, sys
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.losses = []

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, index):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def predict_step(self, batch, index):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


accelerator, precision, out = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))


def trainer(epochs):
    return pl.Trainer(
        accelerator=accelerator, devices=1, max_epochs=epochs, precision=precision,
        logger=False, default_root_dir=out, enable_progress_bar=False,
        enable_model_summary=False,
    )


model = Regressor()
first = trainer(2)
first.fit(model, DataLoader(data, batch_size=8), DataLoader(data, batch_size=16))
validated = first.validate(model, DataLoader(data, batch_size=16), verbose=False)
checkpoint = os.path.join(out, "last.ckpt")
first.save_checkpoint(checkpoint)
resumed = Regressor()
second = trainer(3)
second.fit(resumed, DataLoader(data, batch_size=8), ckpt_path=checkpoint)
predictions = torch.cat(second.predict(resumed, DataLoader(data, batch_size=16)))
print(json.dumps({
    "registered": sorted(pl.accelerators.AcceleratorRegistry),
    "losses": model.losses,
    "resumed": resumed.losses,
    "validated": validated[0]["val_loss"],
    "predictions": predictions.flatten().tolist(),
    "root_device": str(second.strategy.root_device),
}))
"""

FABRIC = """
import json, sys
import torch
from lightning_fabric import Fabric

accelerator, precision = sys.argv[1], sys.argv[2]
fabric = Fabric(accelerator=accelerator, devices=1, precision=precision)
fabric.launch()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer = fabric.setup(model, optimizer)
data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=10))
losses = []
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
print(json.dumps({
    "losses": losses,
    "device": str(fabric.device),
    "parameters": sorted({str(p.device) for p in model.parameters()}),
}))
"""


def _run(tmp_path: Path, source: str, args: list[str], *runner: str) -> dict[str, object]:
    program = tmp_path / "program.py"
    program.write_text(source)
    result = run_python([*runner, str(program), *args], cwd=tmp_path, timeout=600)
    assert result.code == 0, result.err[-3000:]
    found: dict[str, object] = json.loads(result.out.strip().splitlines()[-1])
    found["stderr"] = result.err
    return found


@pytest.fixture(scope="module")
def trainer_on_cpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    where = tmp_path_factory.mktemp("cpu")
    return _run(where, TRAINER, ["cpu", "32-true", str(where / "out")])


@pytest.mark.parametrize(
    ("accelerator", "precision"),
    [
        ("auto", "32-true"),
        ("gpu", "32-true"),
        ("cuda", "16-mixed"),
        ("auto", "bf16-mixed"),
        ("dml", "32-true"),
    ],
)
def test_trainer_fits_validates_resumes_and_predicts_on_the_device_as_on_the_cpu(
    tmp_path: Path, trainer_on_cpu: dict[str, object], accelerator: str, precision: str
) -> None:
    args = [accelerator, precision, str(tmp_path / "out")]
    found = _run(tmp_path, TRAINER, args, "-m", "dmlpatch", "--device", "sim")
    assert found["root_device"] == "privateuseone:0"
    assert "dml" in found["registered"]  # registered as Lightning's third-party accelerators are
    for key in ("losses", "resumed", "predictions"):
        assert found[key] == pytest.approx(trainer_on_cpu[key], rel=1e-5, abs=1e-6), key
    assert found["validated"] == pytest.approx(trainer_on_cpu["validated"], rel=1e-5)
    losses = found["losses"]
    assert isinstance(losses, list) and len(set(losses)) == len(losses) == 8  # it trains
    stderr = str(found["stderr"])
    assert "dmlpatch: running on privateuseone:0" in stderr
    amp_lines = [line for line in stderr.splitlines() if "no mixed precision (AMP)" in line]
    assert len(amp_lines) == (0 if precision == "32-true" else 1)


def test_auto_under_plain_python_and_under_device_cpu_trains_on_the_cpu(
    tmp_path: Path, trainer_on_cpu: dict[str, object]
) -> None:
    for runner in ([], ["-m", "dmlpatch", "--device", "cpu"]):
        found = _run(tmp_path, TRAINER, ["auto", "32-true", str(tmp_path / "out")], *runner)
        assert found["root_device"] == "cpu"
        assert found["losses"] == trainer_on_cpu["losses"]


@pytest.mark.parametrize(("accelerator", "precision"), [("cuda", "32-true"), ("dml", "16-mixed")])
def test_fabric_trains_on_the_device_as_on_the_cpu(
    tmp_path: Path, accelerator: str, precision: str
) -> None:
    on_cpu = _run(tmp_path, FABRIC, ["cpu", "32-true"])
    runner = ("-m", "dmlpatch", "--device", "sim")
    found = _run(tmp_path, FABRIC, [accelerator, precision], *runner)
    assert found["device"] == "privateuseone:0"
    assert found["parameters"] == ["privateuseone:0"]
    assert found["losses"] == pytest.approx(on_cpu["losses"], rel=1e-5, abs=1e-6)


DDP = """
import json, sys
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.losses = []

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    model = Regressor()
    trainer = pl.Trainer(
        accelerator=sys.argv[1], devices=2, strategy="ddp", max_epochs=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=8))
    print(json.dumps({
        "rank": trainer.global_rank,
        "losses": model.losses,
        "root_device": str(trainer.strategy.root_device),
        "weight": model.net.weight.detach().cpu().flatten().tolist(),
    }))
"""


def _ranks(output: str) -> dict[int, dict[str, object]]:
    """Each rank's report; two processes print to one stdout, so lines may run together."""
    decoder = json.JSONDecoder()
    found: dict[int, dict[str, object]] = {}
    start = output.find('{"rank"')
    while start >= 0:
        entry, end = decoder.raw_decode(output, start)
        found[int(entry["rank"])] = entry
        start = output.find('{"rank"', end)
    return found


def test_ddp_over_two_adapters_trains_as_ddp_over_two_cpu_processes(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP)
    on_cpu = run_python(["ddp.py", "cpu"], cwd=tmp_path, timeout=600)
    assert on_cpu.code == 0, on_cpu.err[-3000:]
    patched = run_python(
        ["-m", "dmlpatch", "--device", "sim:0,1", "ddp.py", "gpu"],
        cwd=tmp_path,
        env=clean_env(DMLPATCH_SIM_DEVICES="2"),
        timeout=600,
    )
    assert patched.code == 0, patched.err[-3000:]
    expected, found = _ranks(on_cpu.out), _ranks(patched.out)
    assert sorted(found) == sorted(expected) == [0, 1]
    for rank in (0, 1):
        assert found[rank]["root_device"] == f"privateuseone:{rank}"
        assert found[rank]["losses"] == pytest.approx(expected[rank]["losses"], rel=1e-5)
        assert found[rank]["weight"] == pytest.approx(expected[0]["weight"], rel=1e-5)


# -- the fabric CLI ------------------------------------------------------------------------------
# `fabric run` is the console script of the `lightning` package (pytorch-lightning ships none),
# which lives beside the venv with the click its CLI needs (scripts/setup.sh;
# $DMLPATCH_LIGHTNING may point elsewhere). Its launcher imports lightning.pytorch, whose
# LightningModule has a default_device="cuda" parameter, then starts the one rank through
# torchrun: the launcher said "running on" at that import, and the rank said it again.

LIGHTNING = Path(os.environ.get("DMLPATCH_LIGHTNING", str(REPO / ".cache" / "lightning-2.6.6")))

FABRIC_CLI = """
import json
import torch
from lightning.fabric import Fabric

fabric = Fabric()  # the CLI's options reach it through LT_* variables
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer = fabric.setup(model, optimizer)
data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=10))
losses = []
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "device": str(fabric.device)}))
"""


def test_the_fabric_cli_on_one_device_says_where_it_runs_once(tmp_path: Path) -> None:
    assert (LIGHTNING / "lightning").is_dir(), f"run scripts/setup.sh: no {LIGHTNING}"
    env = clean_env(PYTHONPATH=str(LIGHTNING))
    (tmp_path / "program.py").write_text(FABRIC_CLI)
    options = ["--devices=1", "--main-port=29431", "program.py"]
    cpu = ["-m", "lightning.fabric.cli", "--accelerator=cpu", *options]  # the CLI's command
    on_cpu = run_python(cpu, cwd=tmp_path, env=env)
    assert on_cpu.code == 0, on_cpu.err[-3000:]
    run = ["-m", "dmlpatch", "run", "--device", "sim", "fabric", "run", "--accelerator=cuda"]
    found = run_python([*run, *options], cwd=tmp_path, env=env, timeout=600)
    assert found.code == 0, found.err[-3000:]
    expected = json.loads(on_cpu.out.splitlines()[-1])
    result = json.loads(found.out.splitlines()[-1])
    assert result["device"] == "privateuseone:0"
    assert result["losses"] == pytest.approx(expected["losses"], rel=1e-5, abs=1e-6)
    said = [line for line in found.err_lines if "running on" in line]
    assert len(said) == 1, said
    assert said[0].startswith("dmlpatch: running on privateuseone:0 (Simulated Radeon")
