"""An ``Accelerator()`` training loop as accelerate's docs write it, on the simulated device
against the same loop on the CPU, loss by loss: ``prepare`` (model and optimizer made on the
CPU first), ``accelerator.autocast()``, ``accelerator.backward``, ``gather``, ``save_state`` and
``load_state``; ``mixed_precision`` "no", "fp16" and "bf16", directly and through ``accelerate
launch``.

"fp16" runs as on CUDA: float16 autocast and a GradScaler on the device. Its losses are the
CPU's float32 ones within float16's tolerance, and those of the same loop under the CPU's own
float16 autocast and GradScaler (accelerate has no float16 AMP on the CPU, so the oracle makes
them itself) closely; the last step's gradients overflow float16 and the scaler skips it and
halves its scale there as on the CPU. "bf16" runs in float32 (DirectML has no bfloat16),
said once, equal to the CPU's float32; with ``DMLPATCH_BF16=float16`` in float16. Before the
accelerate spec "bf16" stopped with ``ValueError: bf16 mixed precision requires PyTorch >= 1.10
and a supported device``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import clean_env, run_python

PROGRAM = """
import json, sys
import torch
from accelerate import Accelerator

mixed, state = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
dtypes = set()
model[0].register_forward_hook(lambda module, inputs, output: dtypes.add(str(output.dtype)[6:]))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1) / 4)
loader = torch.utils.data.DataLoader(data, batch_size=8)
if mixed == "launched":
    accelerator = Accelerator()
elif mixed == "cpu-fp16":  # float16 autocast and a GradScaler on the CPU, which accelerate lacks
    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu")
else:
    accelerator = Accelerator(mixed_precision=mixed)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scaler = accelerator.scaler


def autocast():
    if mixed == "cpu-fp16":
        return torch.autocast("cpu", dtype=torch.float16)
    return accelerator.autocast()


losses, scales, skipped = [], [], []
for step, (x, y) in enumerate(loader):
    with autocast():
        loss = torch.nn.functional.mse_loss(model(x), y)
    # The last step's gradients overflow float16, where a scaler skips the step.
    accelerator.backward(loss * 1e5 if scaler is not None and step == len(loader) - 1 else loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(accelerator.gather(loss.detach()).item())
    if scaler is not None:
        scales.append([scaler.get_scale(), str(scaler._scale.device)])
        skipped.append(accelerator.optimizer_step_was_skipped)
accelerator.save_state(state)
trained = [p.detach().cpu().clone() for p in model.parameters()]
with torch.no_grad():
    for parameter in model.parameters():
        parameter.zero_()
if scaler is not None:
    scaler.update(1.0)  # load_state puts the saved scale back
accelerator.load_state(state)
print(json.dumps({
    "losses": losses,
    "device": str(accelerator.device),
    "parameters": sorted({str(p.device) for p in model.parameters()}),
    "restored": all(torch.equal(p.detach().cpu(), t) for p, t in zip(model.parameters(), trained)),
    "dtypes": sorted(dtypes),
    "scales": scales,
    "skipped": skipped,
    "restored_scale": None if scaler is None else scaler.get_scale(),
}))
"""

#: An accelerate config file, as `accelerate config` writes one: the launcher then checks
#: --mixed_precision bf16 against the device before it starts the script.
CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
mixed_precision: 'no'
num_machines: 1
num_processes: 1
use_cpu: false
"""

#: float16's tolerance, step by step, for a run in float16 against one in float32.
FLOAT16 = {"rel": 1e-2, "abs": 1e-3}
#: Against the CPU's float16 autocast, whose operator lists are not CUDA's.
CPU_AUTOCAST = {"rel": 1e-3, "abs": 1e-4}
FP16_LINE = "dmlpatch: mixed precision: autocast computes in float16 on privateuseone:0"
BF16_LINE = "dmlpatch: DirectML has no bfloat16 arithmetic: the program's bfloat16 autocast runs "
BF16_AS_FP16_LINE = "dmlpatch: bfloat16 autocast computes in float16 on DirectML"


def _run(where: Path, args: list[str], *runner: str, **env: str) -> dict[str, Any]:
    (where / "train.py").write_text(PROGRAM)
    program = ["train.py", *args]
    result = run_python([*runner, *program], cwd=where, env=clean_env(**env), timeout=600)
    assert result.code == 0, result.err[-3000:]
    found: dict[str, Any] = json.loads(result.out.strip().splitlines()[-1])
    found["said"] = [line for line in result.err_lines if line.startswith("dmlpatch:")]
    return found


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    where = tmp_path_factory.mktemp("cpu")
    found = _run(where, ["no", str(where / "state")])
    assert found["device"] == "cpu" and found["restored"] is True
    assert found["dtypes"] == ["float32"]
    return found


@pytest.fixture(scope="module")
def cpu_autocast(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The loop under the CPU's float16 autocast and a GradScaler on the CPU."""
    where = tmp_path_factory.mktemp("cpu-fp16")
    found = _run(where, ["cpu-fp16", str(where / "state")])
    assert found["device"] == "cpu" and found["restored"] is True
    assert found["dtypes"] == ["float16"]
    return found


def _on_the_device(found: dict[str, Any]) -> None:
    assert found["device"] == "privateuseone:0"
    assert found["parameters"] == ["privateuseone:0"]
    assert found["restored"] is True


@pytest.mark.parametrize("mixed", ["no", "bf16", "launched-bf16"])
def test_no_and_bf16_train_in_float32_on_the_device_as_on_the_cpu(
    tmp_path: Path, on_cpu: dict[str, Any], mixed: str
) -> None:
    args = ["launched" if mixed.startswith("launched") else mixed, str(tmp_path / "state")]
    runner = ["-m", "dmlpatch", "--device", "sim"]
    if mixed == "launched-bf16":  # `accelerate launch` as a user runs it, after `accelerate config`
        (tmp_path / "config.yaml").write_text(CONFIG)
        runner = ["-m", "dmlpatch", "run", "--device", "sim", "accelerate", "launch"]
        runner += ["--config_file", "config.yaml", "--mixed_precision", "bf16"]
    found = _run(tmp_path, args, *runner)
    _on_the_device(found)
    assert found["losses"] == pytest.approx(on_cpu["losses"], rel=1e-5, abs=1e-6)
    assert found["dtypes"] == ["float32"]  # what the line says: the region runs in float32
    assert found["scales"] == [] and found["restored_scale"] is None
    amp_lines = [line for line in found["said"] if "autocast" in line]
    assert len(amp_lines) == (0 if mixed == "no" else 1), amp_lines
    assert all(line.startswith(BF16_LINE + "in float32") for line in amp_lines)


@pytest.mark.parametrize("mixed", ["fp16", "launched"])
def test_fp16_trains_in_float16_with_a_grad_scaler_on_the_device(
    tmp_path: Path, on_cpu: dict[str, Any], cpu_autocast: dict[str, Any], mixed: str
) -> None:
    runner = ["-m", "dmlpatch", "--device", "sim"]
    if mixed == "launched":  # accelerate launch --mixed_precision fp16, one process
        runner += ["-m", "accelerate.commands.launch", "--num_processes", "1"]
        runner += ["--num_machines", "1", "--mixed_precision", "fp16", "--dynamo_backend", "no"]
    found = _run(tmp_path, [mixed, str(tmp_path / "state")], *runner)
    _on_the_device(found)
    assert found["dtypes"] == ["float16"]
    losses = found["losses"]
    assert len(losses) == 6
    assert losses == pytest.approx(on_cpu["losses"], **FLOAT16)
    assert losses != pytest.approx(on_cpu["losses"], rel=1e-6)  # float16, not float32
    assert losses == pytest.approx(cpu_autocast["losses"], **CPU_AUTOCAST)
    # The scaler's scale lives on the device and moves as the CPU's does: the overflowing last
    # step is skipped and halves it; save_state / load_state keep it.
    assert found["scales"] == [[scale, "privateuseone:0"] for scale, _ in cpu_autocast["scales"]]
    assert [scale for scale, _ in found["scales"]] == [65536.0] * 5 + [32768.0]
    assert found["skipped"] == cpu_autocast["skipped"] == [False] * 5 + [True]
    assert found["restored_scale"] == 32768.0
    assert [line for line in found["said"] if "autocast" in line] == [
        FP16_LINE + " with CUDA's operator lists"
    ]


def test_bf16_with_dmlpatch_bf16_float16_trains_in_float16(
    tmp_path: Path, on_cpu: dict[str, Any]
) -> None:
    runner = ["-m", "dmlpatch", "--device", "sim"]
    found = _run(tmp_path, ["bf16", str(tmp_path / "state")], *runner, DMLPATCH_BF16="float16")
    _on_the_device(found)
    assert found["dtypes"] == ["float16"]
    assert found["losses"] == pytest.approx(on_cpu["losses"], **FLOAT16)
    assert found["losses"] != pytest.approx(on_cpu["losses"], rel=1e-6)
    assert found["scales"] == []  # bf16 has no scaler, on CUDA too
    assert any(line.startswith(BF16_AS_FP16_LINE) for line in found["said"])


@pytest.mark.parametrize("mixed", ["bf16", "cpu-fp16"])
def test_device_cpu_leaves_autocast_and_the_grad_scaler_as_plain_python_runs_them(
    tmp_path: Path, mixed: str
) -> None:
    """On the CPU accelerate's bf16 is the CPU's bfloat16 autocast, and the oracle's float16
    autocast and GradScaler are the program's own: dmlpatch changes neither."""
    plain = _run(tmp_path, [mixed, str(tmp_path / "plain")])
    found = _run(tmp_path, [mixed, str(tmp_path / "state")], "-m", "dmlpatch", "--device", "cpu")
    assert plain["dtypes"] == ["bfloat16" if mixed == "bf16" else "float16"]
    for key in ("losses", "device", "dtypes", "scales", "skipped", "restored_scale"):
        assert found[key] == plain[key], key
    assert [line for line in found["said"] if "autocast" in line] == []
