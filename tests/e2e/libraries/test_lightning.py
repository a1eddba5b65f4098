"""PyTorch Lightning on the simulated device, against the same program on the CPU, loss by loss.

Lightning's CUDA accelerator checks the device it gets (``device.type != "cuda"``: raise), keeps
the optimizer Lightning made before moving the module, and moves the module back to the CPU
after ``fit``. Before dmlpatch rewrote tests of the device and kept parameters across moves,
``accelerator="auto"`` turned a program that trains on the CPU under plain python into
``MisconfigurationException: Device should be GPU, got privateuseone:0 instead``.

Mixed precision runs as on CUDA. ``16-mixed`` (Trainer and Fabric, ``accelerator="cuda"`` or
``"dml"``) is float16 autocast and a GradScaler on the device: its losses are the CPU's float32
ones within float16's tolerance, and close to those of Lightning's own ``MixedPrecision`` plugin
made for the CPU's float16 autocast (Lightning itself runs ``16-mixed`` on the CPU as
``bf16-mixed``); one step's gradients overflow float16 on purpose, and the scaler skips it and
halves its scale as the CPU's does; a checkpoint keeps the scale. ``bf16-mixed`` runs in float32
(DirectML has no bfloat16), said once, equal to the CPU's float32, and in float16 with
``DMLPATCH_BF16=float16``. ``16-true`` is float16 throughout, as on the CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from support import REPO, clean_env, run_python

TRAINER = """
import json, os, sys
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self, overflow_at=-1):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.net[0].register_forward_hook(self.seen)
        self.overflow_at = overflow_at
        self.losses, self.dtypes, self.scales = [], set(), []

    def seen(self, module, inputs, output):
        if self.training:
            self.dtypes.add(str(output.dtype)[6:])

    def scaler(self):
        return getattr(self.trainer.precision_plugin, "scaler", None)

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        if self.scaler() is not None and self.global_step == self.overflow_at:
            return loss * 1e5  # its gradients overflow float16: the scaler skips the step
        return loss

    def on_train_batch_end(self, outputs, batch, index):
        if self.scaler() is not None:
            self.scales.append([self.scaler().get_scale(), str(self.scaler()._scale.device)])

    def validation_step(self, batch, index):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def predict_step(self, batch, index):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


accelerator, precision, out = sys.argv[1], sys.argv[2], sys.argv[3]
plugins = []
if precision == "cpu-16-mixed":  # float16 autocast on the CPU, which Lightning does not offer
    from pytorch_lightning.plugins.precision import MixedPrecision

    plugins, precision = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))], None
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1) / 4)


def trainer(epochs):
    return pl.Trainer(
        accelerator=accelerator, devices=1, max_epochs=epochs, precision=precision,
        plugins=plugins, logger=False, default_root_dir=out, enable_progress_bar=False,
        enable_model_summary=False,
    )


model = Regressor(overflow_at=7)  # the last step of the first fit
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
    "dtypes": sorted(model.dtypes | resumed.dtypes),
    "scales": model.scales + resumed.scales,
}))
"""

FABRIC = """
import json, sys
import torch
from lightning_fabric import Fabric

accelerator, precision = sys.argv[1], sys.argv[2]
plugins = None
if precision == "cpu-16-mixed":  # float16 autocast on the CPU, which Fabric does not offer
    from lightning_fabric.plugins.precision import MixedPrecision

    plugins, precision = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))], None
fabric = Fabric(accelerator=accelerator, devices=1, precision=precision, plugins=plugins)
fabric.launch()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
dtypes = set()
model[0].register_forward_hook(lambda module, inputs, output: dtypes.add(str(output.dtype)[6:]))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer = fabric.setup(model, optimizer)
data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=10))
scaler = getattr(fabric._precision, "scaler", None)
losses, scales = [], []
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        last = len(losses) == 2 * len(loader) - 1
        # The last step's gradients overflow float16, where a scaler skips the step.
        fabric.backward(loss * 1e5 if scaler is not None and last else loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if scaler is not None:
            scales.append([scaler.get_scale(), str(scaler._scale.device)])
print(json.dumps({
    "losses": losses,
    "device": str(fabric.device),
    "parameters": sorted({str(p.device) for p in model.parameters()}),
    "dtypes": sorted(dtypes),
    "scales": scales,
}))
"""

#: float16's tolerance, step by step, for a run in float16 against one in float32.
FLOAT16 = {"rel": 1e-2, "abs": 1e-3}
#: Against the CPU's float16 autocast, whose operator lists are not CUDA's.
CPU_AUTOCAST = {"rel": 1e-3, "abs": 1e-4}
FP16_LINE = (
    "dmlpatch: mixed precision: autocast computes in float16 on privateuseone:0 with CUDA's "
    "operator lists"
)
BF16_LINE = (
    "dmlpatch: DirectML has no bfloat16 arithmetic: the program's bfloat16 autocast runs in float32"
)
BF16_AS_FP16_LINE = "dmlpatch: bfloat16 autocast computes in float16 on DirectML"


def _run(tmp_path: Path, source: str, args: list[str], *runner: str, **env: str) -> dict[str, Any]:
    program = tmp_path / "program.py"
    program.write_text(source)
    result = run_python(
        [*runner, str(program), *args], cwd=tmp_path, env=clean_env(**env), timeout=600
    )
    assert result.code == 0, result.err[-3000:]
    found: dict[str, Any] = json.loads(result.out.strip().splitlines()[-1])
    found["stderr"] = result.err
    found["autocast_lines"] = [line for line in result.err_lines if "autocast" in line]
    return found


def _float16_not_float32(losses: list[float], float32: list[float]) -> None:
    """Losses of a float16 run: the float32 run's within float16's tolerance, yet not its."""
    assert len(losses) == len(float32) >= 4
    assert losses == pytest.approx(float32, **FLOAT16)
    assert losses != pytest.approx(float32, rel=1e-6)


@pytest.fixture(scope="module")
def trainer_on_cpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    where = tmp_path_factory.mktemp("cpu")
    found = _run(where, TRAINER, ["cpu", "32-true", str(where / "out")])
    assert found["dtypes"] == ["float32"] and found["scales"] == []
    return found


@pytest.fixture(scope="module")
def trainer_under_cpu_autocast(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    where = tmp_path_factory.mktemp("cpu-16-mixed")
    found = _run(where, TRAINER, ["cpu", "cpu-16-mixed", str(where / "out")])
    assert found["dtypes"] == ["float16"]
    return found


@pytest.mark.parametrize(
    ("accelerator", "precision"),
    [
        ("auto", "32-true"),
        ("gpu", "32-true"),
        ("auto", "bf16-mixed"),
        ("dml", "32-true"),
    ],
)
def test_trainer_fits_validates_resumes_and_predicts_on_the_device_as_on_the_cpu(
    tmp_path: Path, trainer_on_cpu: dict[str, Any], accelerator: str, precision: str
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
    # bf16-mixed: what the line says is what ran, float32 (Lightning makes no scaler for it).
    assert found["dtypes"] == ["float32"] and found["scales"] == []
    lines = found["autocast_lines"]
    assert len(lines) == (0 if precision == "32-true" else 1), lines
    assert all(line.startswith(BF16_LINE) for line in lines)


@pytest.mark.parametrize("accelerator", ["cuda", "dml"])
def test_trainer_16_mixed_trains_in_float16_with_a_grad_scaler_on_the_device(
    tmp_path: Path,
    trainer_on_cpu: dict[str, Any],
    trainer_under_cpu_autocast: dict[str, Any],
    accelerator: str,
) -> None:
    args = [accelerator, "16-mixed", str(tmp_path / "out")]
    found = _run(tmp_path, TRAINER, args, "-m", "dmlpatch", "--device", "sim")
    assert found["root_device"] == "privateuseone:0"
    assert found["dtypes"] == ["float16"]
    # Up to the overflow the float32 run is comparable: every loss is taken before its step.
    _float16_not_float32(found["losses"], trainer_on_cpu["losses"])
    expected = trainer_under_cpu_autocast
    for key in ("losses", "resumed", "predictions"):
        assert found[key] == pytest.approx(expected[key], **CPU_AUTOCAST), key
    assert found["validated"] == pytest.approx(expected["validated"], **CPU_AUTOCAST)
    # The scale is a device tensor; the overflowing step halves it, the checkpoint keeps it.
    assert found["scales"] == [[scale, "privateuseone:0"] for scale, _ in expected["scales"]]
    assert [scale for scale, _ in found["scales"]] == [65536.0] * 7 + [32768.0] * 5
    assert found["autocast_lines"] == [FP16_LINE]


def test_trainer_bf16_mixed_with_dmlpatch_bf16_float16_trains_in_float16(
    tmp_path: Path, trainer_on_cpu: dict[str, Any]
) -> None:
    args = ["gpu", "bf16-mixed", str(tmp_path / "out")]
    runner = ("-m", "dmlpatch", "--device", "sim")
    found = _run(tmp_path, TRAINER, args, *runner, DMLPATCH_BF16="float16")
    assert found["root_device"] == "privateuseone:0"
    assert found["dtypes"] == ["float16"]
    assert found["scales"] == []  # bf16-mixed has no scaler, on CUDA too
    for key in ("losses", "resumed"):
        _float16_not_float32(found[key], trainer_on_cpu[key])
    assert any(line.startswith(BF16_AS_FP16_LINE) for line in found["autocast_lines"])


@pytest.mark.parametrize(
    ("source", "precision"),
    [(TRAINER, "32-true"), (TRAINER, "16-mixed"), (FABRIC, "cpu-16-mixed")],
    ids=["trainer-32-true", "trainer-16-mixed", "fabric-cpu-16-mixed"],
)
def test_under_plain_python_and_under_device_cpu_it_trains_on_the_cpu_alike(
    tmp_path: Path, trainer_on_cpu: dict[str, Any], source: str, precision: str
) -> None:
    """``--device cpu`` leaves the CPU's autocast and GradScaler as written: Lightning's
    ``16-mixed`` on the CPU is its bfloat16 autocast, the plugin's the CPU's float16 one."""
    args = ["auto", precision, str(tmp_path / "out")][: 3 if source == TRAINER else 2]
    plain = _run(tmp_path, source, args)
    found = _run(tmp_path, source, args, "-m", "dmlpatch", "--device", "cpu")
    assert found["root_device" if source == TRAINER else "device"] == "cpu"
    expected_dtype = {"32-true": "float32", "16-mixed": "bfloat16", "cpu-16-mixed": "float16"}
    assert plain["dtypes"] == [expected_dtype[precision]]
    for key in ("losses", "resumed", "validated", "predictions", "dtypes", "scales"):
        assert found.get(key) == plain.get(key), key
    if precision == "32-true":
        assert found["losses"] == trainer_on_cpu["losses"]
    assert found["autocast_lines"] == []


@pytest.fixture(scope="module")
def fabric_on_cpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Fabric on the CPU in float32, under the CPU's float16 autocast, and in float16."""
    where = tmp_path_factory.mktemp("fabric-cpu")
    runs = {name: _run(where, FABRIC, ["cpu", name]) for name in ("32-true", "16-true")}
    runs["16-mixed"] = _run(where, FABRIC, ["cpu", "cpu-16-mixed"])
    assert [runs[name]["dtypes"] for name in runs] == [["float32"], ["float16"], ["float16"]]
    return runs


@pytest.mark.parametrize(
    ("accelerator", "precision"),
    [
        ("cuda", "32-true"),
        ("dml", "16-mixed"),
        ("cuda", "16-mixed"),
        ("cuda", "bf16-mixed"),
        ("dml", "16-true"),
    ],
)
def test_fabric_trains_on_the_device_as_on_the_cpu(
    tmp_path: Path, fabric_on_cpu: dict[str, dict[str, Any]], accelerator: str, precision: str
) -> None:
    runner = ("-m", "dmlpatch", "--device", "sim")
    found = _run(tmp_path, FABRIC, [accelerator, precision], *runner)
    assert found["device"] == "privateuseone:0"
    assert found["parameters"] == ["privateuseone:0"]
    float32 = fabric_on_cpu["32-true"]
    if precision in ("32-true", "bf16-mixed"):  # bf16-mixed runs in float32, as it says
        assert found["losses"] == pytest.approx(float32["losses"], rel=1e-5, abs=1e-6)
        assert found["dtypes"] == ["float32"] and found["scales"] == []
        lines = found["autocast_lines"]
        assert len(lines) == (0 if precision == "32-true" else 1), lines
        assert all(line.startswith(BF16_LINE) for line in lines)
        return
    expected = fabric_on_cpu[precision]
    assert found["dtypes"] == ["float16"]
    _float16_not_float32(found["losses"], float32["losses"])
    assert found["losses"] == pytest.approx(expected["losses"], **CPU_AUTOCAST)
    if precision == "16-true":  # the module itself is float16: no autocast, no scaler
        assert found["scales"] == [] and found["autocast_lines"] == []
        return
    assert found["scales"] == [[scale, "privateuseone:0"] for scale, _ in expected["scales"]]
    assert [scale for scale, _ in found["scales"]] == [65536.0] * 7 + [32768.0]
    assert found["autocast_lines"] == [FP16_LINE]


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
