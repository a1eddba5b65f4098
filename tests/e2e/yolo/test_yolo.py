"""Ultralytics YOLO on the simulated DirectML device: the seed's `yolo ... device=dml` workflow.

Real ultralytics (8.4.190 from the venv; 8.1.47 from ``$DMLPATCH_ULTRALYTICS_8_1``), a
synthetic 64x64 dataset, ``yolov8n.yaml`` (no weights; the AMP check's ``yolo26n.pt`` /
``yolov8n.pt`` are built by ``amp_weights.py``), no network (every attempt is logged and must
not happen), default simulator profile (torch-directml 0.2.5's gaps).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import sysconfig
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
import torchvision
import yolo_fixtures
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dmlpatch import paths
from dmlpatch.opfix.vision.detection import greedy_nms

from support import (
    REPO,
    Result,
    distribution_digests,
    file_stamps,
    linked_venv,
    run_python,
    written_between,
)

HERE = Path(__file__).resolve().parent
ULTRALYTICS = Path(__import__("ultralytics").__file__).parent
# scripts/setup.sh installs the early-2024 line beside the venv, not into it.
OLD_ULTRALYTICS = Path(
    os.environ.get(
        "DMLPATCH_ULTRALYTICS_8_1",
        str(REPO / ".cache" / "ultralytics-8.1.47"),
    )
)
OLD_INSTALL = "bash scripts/setup.sh (it installs ultralytics 8.1.47 into .cache/)"
YOLO = [
    "-c",
    # What the `yolo` console script does; argv is set first because ultralytics reads it at
    # import time.
    "import sys; sys.argv[0] = 'yolo'; from ultralytics.cfg import entrypoint; "
    "sys.exit(entrypoint())",
]
ADAPTER = "DML:0 (Simulated Radeon (discrete))"
# ultralytics' own AMP check (8.4: "...checks...", 8.1: "...checks with YOLOv8n..."), and its
# verdicts; the check runs on the device with the weights amp_weights.py writes.
AMP_CHECK = "running Automatic Mixed Precision (AMP) checks"
AMP_PASSED = "checks passed ✅"
AMP_FAILED = "checks failed"
AMP_SKIPPED = "checks skipped"
SEED_ERROR = "Return counts not implemented for unique operator for DirectML."


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.installed = {path: _digest(path) for path in _installed()}
        self.torch_files = distribution_digests("torch", "torchvision")
        self.data = yolo_fixtures.build_dataset(root / "data")
        self.config = yolo_fixtures.build_config_dir(root / "config")
        self.netlog = root / "network.log"
        self.runs = root / "runs"
        self._amp_weights: set[bool] = set()

    def env(self, old: bool = False, **extra: str) -> dict[str, str]:
        paths = [OLD_ULTRALYTICS] if old else []
        if old:
            # Missing, the venv's ultralytics would answer instead: a test of 8.1 that is not.
            assert (OLD_ULTRALYTICS / "ultralytics").is_dir(), f"install it first: {OLD_INSTALL}"
            # torch >= 2.6 loads checkpoints weights-only by default; 8.1 predates that and
            # reloads its own best.pt without weights_only=False (not a DirectML matter).
            extra.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
        # What these runs check is that dmlpatch's compositions carry a whole YOLO run on the
        # device: kept whatever the cost model would send through the CPU for these small
        # images (bincount, nms); tests/e2e/opfix/test_opfix_fix_costs.py checks the choice.
        extra.setdefault("DMLPATCH_DEVICE_OPS", "all")
        return yolo_fixtures.offline_env(self.config, self.netlog, pythonpath=paths, **extra)

    def amp_weights(self, old: bool = False) -> None:
        """The weights check_amp loads (yolo26n.pt / yolov8n.pt), in this workspace's weights
        directory, which the line's settings now name; built once per line."""
        if old in self._amp_weights:
            return
        result = run_python(
            [str(HERE / "amp_weights.py"), str(self.root / "weights")], env=self.env(old=old)
        )
        _assert_ok(result)
        self._amp_weights.add(old)

    def yolo_args(self, mode: str, name: str, **overrides: str) -> list[str]:
        """The seed's command line, at imgsz=64 on the synthetic data."""
        args = {
            "task": "detect",
            "mode": mode,
            "val": "True",
            "data": str(self.data),
            "model": "yolov8n.yaml",
            "epochs": "1",
            "workers": "0",
            "imgsz": "64",
            "seed": "1",
            "device": "dml",
            "amp": "False",
            "verbose": "True",
            "batch": "4",
            "project": str(self.runs),
            "name": name,
            "exist_ok": "True",
        }
        if mode != "train":
            for key in ("val", "epochs", "workers", "seed", "amp", "batch"):
                args.pop(key)
        if mode == "predict":
            args.pop("data")
            args["source"] = str(self.data.parent / "images" / "val")
        args.update(overrides)
        return [f"{k}={v}" for k, v in args.items()]

    def network_attempts(self) -> list[str]:
        if not self.netlog.exists():
            return []
        return self.netlog.read_text().splitlines()


def _installed() -> list[Path]:
    old = OLD_ULTRALYTICS / "ultralytics"
    return [ULTRALYTICS, *([old] if old.is_dir() else [])]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("yolo"))


def _dmlpatch_run(
    ws: Workspace,
    argv: list[str],
    device: Optional[str] = "sim",
    report: Optional[Path] = None,
    old: bool = False,
) -> Result:
    options = [f"--device={device}"] if device else []
    if report is not None:
        options.append(f"--report={report}")
    return run_python(["-m", "dmlpatch", "run", *options, "yolo", *argv], env=ws.env(old=old))


def _train_losses(results_csv: Path) -> list[float]:
    with results_csv.open() as stream:
        row = next(csv.DictReader(stream, skipinitialspace=True))
    return [float(row[f"train/{k}_loss"]) for k in ("box", "cls", "dfl")]


def _assert_ok(result: Result) -> None:
    assert result.code == 0, result.err[-3000:]


# -- the seed's command line -----------------------------------------------------------------


def test_cli_train_val_predict_under_dmlpatch_run(ws: Workspace) -> None:
    report = ws.root / "train-report.json"
    train = _dmlpatch_run(ws, ws.yolo_args("train", "cli"), report=report)
    _assert_ok(train)
    output = train.out + train.err
    assert ADAPTER in output
    assert AMP_CHECK not in output  # amp=False: nothing to check
    data = json.loads(report.read_text())
    assert data["ops"]["refused"] == {}
    assert data["ops"]["native"]["aten::convolution_overrideable"] > 0
    assert data["ops"]["native"]["aten::convolution_backward_overrideable"] > 0
    assert "aten::_unique2" not in data["ops"]["fallback"]
    _assert_all_on_device(train, data)

    best = ws.runs / "cli" / "weights" / "best.pt"
    for mode in ("val", "predict"):
        report = ws.root / f"{mode}-report.json"
        result = _dmlpatch_run(
            ws, ws.yolo_args(mode, f"cli-{mode}", model=str(best)), report=report
        )
        _assert_ok(result)
        assert ADAPTER in result.out + result.err
        data = json.loads(report.read_text())
        assert data["ops"]["refused"] == {}
        # NMS ran on the device: torchvision has no DirectML kernel to fall back from.
        assert "torchvision::nms" not in data["ops"]["fallback"]
        _assert_all_on_device(result, data)
    assert ws.network_attempts() == []


def test_rtdetr_train_val_predict_on_directml_equal_to_cpu(ws: Workspace) -> None:
    """RT-DETR (``rtdetr-l.yaml``): deformable attention samples with grid_sample and its
    decoder calls logit every step, and training ends by fusing RepConv for 'Validating
    best.pt' (a CPU module given device weights through .data). On the device: no CPU
    fallback, no refusal, the CPU's losses."""
    rtdetr = {"model": "rtdetr-l.yaml", "batch": "2"}
    cpu = run_python(
        [*YOLO, *ws.yolo_args("train", "rtdetr-cpu", device="cpu", deterministic="True", **rtdetr)],
        env=ws.env(),
        timeout=600,
    )
    _assert_ok(cpu)
    report = ws.root / "rtdetr-train.json"
    train = _dmlpatch_run(
        ws,
        ws.yolo_args("train", "rtdetr", deterministic="True", **rtdetr),
        report=report,
    )
    _assert_ok(train)
    assert "Validating" in train.out + train.err
    data = json.loads(report.read_text())
    assert data["ops"]["fallback"] == {} and data["ops"]["refused"] == {}, data["ops"]
    for op in ("aten::grid_sampler_2d", "aten::logit"):
        assert data["ops"]["fixed"].get(op, 0) > 0, data["ops"]["fixed"]
    expected = _rtdetr_losses(ws.runs / "rtdetr-cpu" / "results.csv")
    got = _rtdetr_losses(ws.runs / "rtdetr" / "results.csv")
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-5)
    # Training ended by validating best.pt (fused) in the same run; prediction is its own.
    best = ws.runs / "rtdetr" / "weights" / "best.pt"
    report = ws.root / "rtdetr-predict.json"
    result = _dmlpatch_run(
        ws, ws.yolo_args("predict", "rtdetr-predict", model=str(best)), report=report
    )
    _assert_ok(result)
    data = json.loads(report.read_text())
    assert data["ops"]["fallback"] == {} and data["ops"]["refused"] == {}, data["ops"]
    assert ws.network_attempts() == []


def _rtdetr_losses(results_csv: Path) -> list[float]:
    with results_csv.open() as stream:
        row = next(csv.DictReader(stream, skipinitialspace=True))
    return [float(value) for key, value in row.items() if key.startswith("train/")]


def _assert_all_on_device(result: Result, report: dict[str, Any]) -> None:
    """Every layer call ran on the device: the report says so and the run ends silently."""
    compute = report["compute"]
    on_cpu = compute["on_cpu"]
    assert compute["device_share"] == 1.0, json.dumps(compute)
    assert on_cpu == {"calls": 0, "flops": 0}
    assert compute["on_device"]["calls"] > 0
    assert not any(line.startswith("dmlpatch: warning") for line in result.err.splitlines())


@pytest.fixture(scope="module")
def activated(ws: Workspace) -> Iterator[str]:
    """A throw-away venv that sees our site-packages, activated with --device sim."""
    for python, _ in linked_venv():
        result = run_python(["-m", "dmlpatch", "activate", "--device", "sim"], python=python)
        assert result.code == 0, result.err
        try:
            yield python
        finally:
            run_python(["-m", "dmlpatch", "deactivate"], python=python)


def test_cli_after_activate_with_amp_true(ws: Workspace, activated: str) -> None:
    python = activated
    ws.amp_weights()
    train = run_python(
        [*YOLO, *ws.yolo_args("train", "activated", amp="True")], env=ws.env(), python=python
    )
    _assert_ok(train)
    output = train.out + train.err
    assert ADAPTER in output
    # ultralytics' own check ran on the device, once, and passed: training is float16 AMP.
    assert output.count(AMP_CHECK) == 1 and output.count(AMP_PASSED) == 1
    assert AMP_SKIPPED not in output and AMP_FAILED not in output
    best = ws.runs / "activated" / "weights" / "best.pt"
    for mode in ("val", "predict"):
        result = run_python(
            [*YOLO, *ws.yolo_args(mode, f"activated-{mode}", model=str(best))],
            env=ws.env(),
            python=python,
        )
        _assert_ok(result)
        assert ADAPTER in result.out + result.err
    assert ws.network_attempts() == []

    # deactivate restores stock ultralytics: device=dml is a CUDA request again.
    assert run_python(["-m", "dmlpatch", "deactivate"], python=python).code == 0
    stock = run_python(
        [*YOLO, *ws.yolo_args("predict", "stock", model=str(best))], env=ws.env(), python=python
    )
    assert stock.code != 0
    assert "Invalid CUDA 'device=dml' requested" in stock.err


# -- the Python API, against the CPU ----------------------------------------------------------


def _api(ws: Workspace, device: str, under_dmlpatch: bool, old: bool = False) -> dict:
    out = ws.root / f"api-{device}-{old}.json"
    script = [
        str(HERE / "train_api.py"),
        str(ws.data),
        str(ws.runs / f"api-{device}-{old}"),
        str(out),
        device,
        "False",
    ]
    prefix = ["-m", "dmlpatch", "--device", "sim"] if under_dmlpatch else []
    result = run_python([*prefix, *script], env=ws.env(old=old))
    _assert_ok(result)
    return json.loads(out.read_text())


def test_api_on_sim_matches_cpu_with_every_copy_accounted(ws: Workspace) -> None:
    cpu = _api(ws, "cpu", under_dmlpatch=False)
    sim = _api(ws, "dml", under_dmlpatch=True)
    assert len(sim["steps"]) == len(cpu["steps"]) == 2
    for on_sim, on_cpu in zip(sim["steps"], cpu["steps"]):
        assert on_sim["losses"].keys() == on_cpu["losses"].keys()
        for key, value in on_cpu["losses"].items():
            assert on_sim["losses"][key] == pytest.approx(value, rel=1e-5, abs=1e-6)
    assert sim["conv_devices"] == ["privateuseone:0 privateuseone:0"]
    assert sim["parameters"] == ["privateuseone:0"]
    assert sim["predicted"] == cpu["predicted"]
    assert sim["predicted_in_inference_mode"] == cpu["predicted_in_inference_mode"]
    assert sim["predicted_in_inference_mode"] == sim["predicted"]
    assert sim["predict_device"] == "privateuseone:0"
    for step in sim["steps"]:
        copies = step["copies"]
        # The loader's batch: img, cls, bboxes, batch_idx.
        assert copies["batch"] == {"h2d": 4, "d2h": 0, "d2d": 0, "fallback": 0, "refused": 0}
        # Forward+loss+backward: 6 are ultralytics' make_anchors grids (tal.py:560-561,
        # torch.arange on the CPU, 2 per feature level); 3 are small constants the loss makes on
        # the host: loss.py:441 torch.tensor(imgsz, device=...), loss.py:445 the list index
        # imgsz[[1, 0, 1, 0]], tal.py:349 torch.tensor(stride_val, device=...). All 9 happen on
        # CUDA too (the gap-free permissive profile counts the same 9). No operator may fall
        # back to the CPU or be refused.
        assert copies["compute"]["fallback"] == 0, copies
        assert copies["compute"]["refused"] == 0
        assert copies["compute"]["h2d"] == 9
        assert copies["compute"]["d2d"] == 0
        # The progress line reads the losses as Python numbers (scalar reads, not copies).
        assert copies["logging"] == {"h2d": 0, "d2h": 0, "d2d": 0, "fallback": 0, "refused": 0}
    assert ws.network_attempts() == []


REPCONV = """
import json, torch
from ultralytics.nn.modules.conv import RepConv

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
module = RepConv(8, 8).eval()
for bn in (module.conv1.bn, module.conv2.bn):
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
module = module.to(device)
x = torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(1)).to(device)
with torch.no_grad():
    before = module(x)
    module.fuse_convs()  # RT-DETR's 'Validating best.pt'
    after = module.forward_fuse(x)
print(json.dumps({"device": str(module.conv.weight.device), "before": before.cpu().tolist(),
                  "after": after.cpu().tolist()}))
"""


def test_rtdetr_repconv_fuses_on_directml(ws: Workspace, tmp_path: Path) -> None:
    script = tmp_path / "fuse.py"
    script.write_text(REPCONV)
    plain = run_python([str(script)], env=ws.env())
    _assert_ok(plain)
    patched = run_python(["-m", "dmlpatch", "--device", "sim", str(script)], env=ws.env())
    _assert_ok(patched)
    expected, got = json.loads(plain.out), json.loads(patched.out)
    assert got["device"] == "privateuseone:0" and expected["device"] == "cpu"
    assert torch.allclose(torch.tensor(got["after"]), torch.tensor(expected["after"]), atol=1e-5)
    assert torch.allclose(torch.tensor(got["after"]), torch.tensor(got["before"]), atol=1e-5)
    # Without the spec, PyTorch refuses the fused module's .data assignment across devices.
    unpatched = run_python(
        [
            "-c",
            "from dmlpatch import sim; sim.load()\n"
            + REPCONV.replace(
                'torch.device("cuda" if torch.cuda.is_available() else "cpu")', "sim.device(0)"
            ),
        ],
        env=ws.env(),
    )
    assert unpatched.code == 1
    assert (
        unpatched.err.rstrip()
        .splitlines()[-1]
        .startswith("RuntimeError: Attempted to call `variable.set_data(tensor)`")
    )


# -- without dmlpatch, and bad requests --------------------------------------------------------

SEED_EDIT = """
import sys, torch
from dmlpatch import sim
sim.load()  # the simulated DirectML device, no patches
import ultralytics.engine.trainer as trainer
# The seed's hand edit of select_device: a 'dml' branch returning the DirectML device.
trainer.select_device = lambda device='', *a, **k: torch.device('privateuseone', 0)
from ultralytics import YOLO
YOLO('yolov8n.yaml').train(data=sys.argv[1], epochs=1, imgsz=64, batch=4, workers=0,
    device='dml', amp=False, project=sys.argv[2], name='seed', plots=False)
"""


def test_without_dmlpatch_the_seed_errors_come_back(ws: Workspace) -> None:
    plain = run_python([*YOLO, *ws.yolo_args("train", "plain")], env=ws.env())
    assert plain.code != 0
    assert "Invalid CUDA 'device=dml' requested" in plain.err
    edited = run_python(["-c", SEED_EDIT, str(ws.data), str(ws.runs)], env=ws.env())
    assert edited.code != 0
    assert edited.err.rstrip().splitlines()[-1] == f"RuntimeError: {SEED_ERROR}"


def test_dml_without_directml_names_the_reason(ws: Workspace) -> None:
    result = _dmlpatch_run(ws, ws.yolo_args("predict", "no-dml"), device=None)
    assert result.code != 0
    last = result.err.rstrip().splitlines()[-1]
    assert last.startswith("ValueError: Invalid DirectML 'device=dml' requested: dmlpatch runs ")
    assert "DirectML unavailable: torch-directml is not installed" in last
    assert "Use 'device=cpu', or 'device=sim' for the simulated DirectML device." in last


def test_adapter_out_of_range_gives_the_valid_range(ws: Workspace) -> None:
    result = _dmlpatch_run(ws, ws.yolo_args("predict", "dml7", device="dml:7"))
    assert result.code != 0
    assert result.err.rstrip().splitlines()[-1] == (
        "ValueError: Invalid DirectML 'device=dml:7' requested: only 1 DirectML adapter(s) "
        "available (dml:0 = Simulated Radeon (discrete)); valid: 'device=dml' or "
        "'device=dml:0'."
    )


@pytest.mark.parametrize("old", [False, True], ids=["8.4", "8.1"])
def test_ddp_over_two_adapters_trains_an_epoch(ws: Workspace, old: bool) -> None:
    """device=dml:0,1: ultralytics launches two DDP ranks, one per simulated adapter."""
    name = "ddp-8.1" if old else "ddp"
    reports = ws.root / f"{name}-report-{{rank}}.json"
    argv = ws.yolo_args("train", name, device="dml:0,1", plots="False")
    result = run_python(
        ["-m", "dmlpatch", "run", "--device=sim:0,1", f"--report={reports}", "yolo", *argv],
        env=ws.env(old=old, DMLPATCH_SIM_DEVICES="2"),
    )
    _assert_ok(result)
    output = result.out + result.err
    assert ("Ultralytics YOLOv8.1.47" in output) == old
    assert "DDP:" in output and "torch.distributed.run --nproc_per_node 2" in output
    assert "Traceback" not in output
    losses = _train_losses(ws.runs / name / "results.csv")
    assert all(math.isfinite(loss) and loss > 0 for loss in losses)
    for rank in ("0", "1"):
        data = json.loads(Path(str(reports).replace("{rank}", rank)).read_text())
        assert data["backend"] == "sim"
        assert data["ops"]["refused"] == {}
        assert data["ops"]["native"]["aten::convolution_backward_overrideable"] > 0
        functions = data["patches"]["ultralytics"]["functions"]
        assert "ultralytics.engine.trainer:BaseTrainer._setup_ddp" in functions
    assert ws.network_attempts() == []


def test_device_sim_loads_the_simulator_on_demand(ws: Workspace) -> None:
    best = ws.runs / "cli" / "weights" / "best.pt"
    result = _dmlpatch_run(
        ws, ws.yolo_args("predict", "sim-demand", device="sim", model=str(best)), device=None
    )
    _assert_ok(result)
    assert ADAPTER in result.out + result.err


# -- ultralytics 8.1 (early 2024) ----------------------------------------------------------------


def test_ultralytics_8_1_trains_on_sim_like_on_cpu(ws: Workspace) -> None:
    """float32 on both, loss for loss (8.1's float16 AMP: test_amp_trains_in_float16_...)."""
    assert (OLD_ULTRALYTICS / "ultralytics").is_dir(), f"install it first: {OLD_INSTALL}"
    sim = _dmlpatch_run(ws, ws.yolo_args("train", "old-sim", plots="False"), old=True)
    _assert_ok(sim)
    output = sim.out + sim.err
    assert "Ultralytics YOLOv8.1.47 🚀" in output and ADAPTER in output
    assert AMP_CHECK not in output
    cpu = run_python(
        [*YOLO, *ws.yolo_args("train", "old-cpu", device="cpu", plots="False")],
        env=ws.env(old=True),
    )
    _assert_ok(cpu)
    assert _train_losses(ws.runs / "old-sim" / "results.csv") == pytest.approx(
        _train_losses(ws.runs / "old-cpu" / "results.csv"), rel=1e-5
    )
    best = ws.runs / "old-sim" / "weights" / "best.pt"
    predict = _dmlpatch_run(ws, ws.yolo_args("predict", "old-predict", model=str(best)), old=True)
    _assert_ok(predict)
    assert ws.network_attempts() == []


# -- mixed precision: amp=True ------------------------------------------------------------------

#: Epochs of the AMP runs: two steps each (8 images, batch 4).
AMP_EPOCHS = 3


def _amp_train(ws: Workspace, device: str, old: bool) -> tuple[dict, Result, dict]:
    name = f"amp-{device}-{'8.1' if old else '8.4'}"
    out = ws.root / f"{name}.json"
    report = ws.root / f"{name}-report.json"
    script = [str(HERE / "train_amp.py"), str(ws.data), str(ws.runs / name), str(out), device]
    prefix = ["-m", "dmlpatch", "--device", "sim", f"--report={report}"] if device != "cpu" else []
    result = run_python([*prefix, *script, str(AMP_EPOCHS)], env=ws.env(old=old))
    _assert_ok(result)
    return json.loads(out.read_text()), result, json.loads(report.read_text()) if prefix else {}


def _amp_check(env: dict[str, str], device: str, *options: str) -> tuple[dict, Result]:
    prefix = ["-m", "dmlpatch", "--device", "sim"] if device != "cpu" else []
    result = run_python([*prefix, str(HERE / "amp_check.py"), device, *options], env=env)
    _assert_ok(result)
    return json.loads(result.out.splitlines()[-1]), result


@pytest.mark.parametrize("old", [False, True], ids=["8.4", "8.1"])
def test_amp_trains_in_float16_on_the_device_after_ultralytics_own_check(
    ws: Workspace, old: bool
) -> None:
    """amp=True, the default: ultralytics' check_amp loads its AMP weights (built offline, see
    amp_weights.py), compares float32 with autocast on the device and passes, as the same
    comparison passes with the CPU's float16; training then runs in float16 mixed precision on
    the device with a GradScaler there, loss by loss within float16's tolerance of the CPU's
    float32 run (on the CPU ultralytics has no AMP)."""
    ws.amp_weights(old)
    reference, _ = _amp_check(ws.env(old=old), "cpu")
    assert reference["verdict"] is True and reference["boxes"][0] == reference["boxes"][1] > 0
    sim, result, report = _amp_train(ws, "dml", old)
    cpu, _, _ = _amp_train(ws, "cpu", old)
    output = result.out + result.err
    assert output.count(AMP_CHECK) == 1 and output.count(AMP_PASSED) == 1, output[-3000:]
    assert AMP_SKIPPED not in output and AMP_FAILED not in output
    assert sim["amp"] and not cpu["amp"]
    assert sim["scaler"] == {"enabled": True, "device": "privateuseone"}
    assert len(sim["steps"]) == len(cpu["steps"]) == 2 * AMP_EPOCHS
    assert {step["dtype"] for step in sim["steps"]} == {"torch.float16"}
    assert {step["dtype"] for step in cpu["steps"]} == {"torch.float32"}
    # The autocast kernels served the steps' operators (and the check's), on the device.
    assert report["autocast"]["float16"] > 0, report["autocast"]
    assert report["ops"]["fallback"] == {} and report["ops"]["refused"] == {}, report["ops"]
    # The first step, before training moves the weights apart: on the CPU from the device's
    # weights and batch, float32 is the CPU run's first step, and the device's float16 is the
    # CPU's float16 autocast within rounding. 8.1 computes its loss in float16 too: its
    # assigner picks each target's anchors by a top-k of float16 scores, so a rounding either
    # way moves an anchor, and the CPU's float16 kernels round otherwise than the device's
    # (float32 products rounded once, as CUDA's): within 1% there, 2% from float32 ...
    first = sim["first_step"]
    assert first["float32"] == pytest.approx(cpu["steps"][0]["losses"], rel=1e-5)
    float16 = sim["steps"][0]["losses"]
    if _torch_release() >= (2, 14):  # where the bounds above were measured
        assert float16 == pytest.approx(first["float16"], rel=1e-2 if old else 1e-3)
    # On every torch, the device's float16 is as close to float32 as the CPU's float16
    # autocast, within a rounding of float16. (On torch 2.4 the CPU's lands 0.10-0.13% above
    # float32 on 8.4's losses and the device's within 0.07% of it: up to 0.18% apart.)
    for name, exact in first["float32"].items():
        spread = abs(first["float16"][name] - exact) + 1e-3 * abs(exact)
        assert abs(float16[name] - exact) <= spread, (name, float16, first)
    # ... and step by step the losses are the CPU's float32 ones within float16's tolerance.
    for on_sim, on_cpu in zip(sim["steps"], cpu["steps"]):
        assert on_sim["losses"] == pytest.approx(on_cpu["losses"], rel=3e-2)
    # Scaled gradients that overflow float16 skip their step and halve the scale (from 2**16),
    # as the CPU's float16 does with these weights; six steps are too few for it to grow.
    scales = [step["scale"] for step in sim["steps"]]
    assert scales[0] <= 2.0**15 and scales == sorted(scales, reverse=True)
    assert ws.network_attempts() == []


def _torch_release() -> tuple[int, int]:
    major, minor = version("torch").split(".")[:2]
    return int(major), int(minor)


def test_amp_check_fails_on_the_device_where_it_fails_on_the_cpu(
    ws: Workspace, tmp_path: Path
) -> None:
    """The check decides on its merits: with random weights at their measured BatchNorm
    statistics (a chaotic network: float16's rounding moves its boxes by pixels, see
    amp_weights.py), the comparison fails with the CPU's float16 autocast, and check_amp fails on
    the device too: AMP off, as ultralytics decides on CUDA."""
    config = yolo_fixtures.build_config_dir(tmp_path / "config")
    netlog = tmp_path / "network.log"
    env = yolo_fixtures.offline_env(config, netlog, DMLPATCH_DEVICE_OPS="all")
    weights = [str(HERE / "amp_weights.py"), str(tmp_path / "weights"), "measured"]
    built = run_python(weights, env=env)
    _assert_ok(built)
    reference, _ = _amp_check(env, "cpu")
    assert reference["verdict"] is False and reference["boxes"][0] == reference["boxes"][1] > 0
    assert reference["max_diff"] > 0.5
    got, result = _amp_check(env, "dml")
    assert got == {"verdict": False}
    output = result.out + result.err
    assert AMP_FAILED in output and AMP_PASSED not in output
    assert not netlog.exists()


def test_amp_check_without_the_autocast_kernels_says_float32_before_any_download(
    tmp_path: Path,
) -> None:
    """Where dmlpatch's autocast kernels are not installed, check_amp answers False with one
    warning, and does not look for its weights (none here, and no network)."""
    config = yolo_fixtures.build_config_dir(tmp_path / "config")
    netlog = tmp_path / "network.log"
    env = yolo_fixtures.offline_env(config, netlog, DMLPATCH_DEVICE_OPS="all")
    got, result = _amp_check(env, "dml", "--no-autocast")
    assert got == {"verdict": False}
    output = result.out + result.err
    skipped = (
        "checks skipped ⚠️, dmlpatch's autocast kernels for DirectML are not installed; "
        "training in float32 as with 'amp=False'."
    )
    assert output.count(skipped) == 1
    assert "downloading" not in output and AMP_CHECK not in output
    assert not netlog.exists()


def test_footprint_of_the_seed_run_is_dmlpatch_cache_and_outputs(
    ws: Workspace, record_property: Callable[[str, object], None]
) -> None:
    """A training run (bytecode written, as users have it) creates or changes nothing but
    dmlpatch's caches and the program's own outputs; the list goes to the test summary."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    cache = Path(paths.cache_directory())
    roots = [purelib, cache, ws.root, OLD_ULTRALYTICS]
    before = file_stamps(*roots)
    report = ws.root / "footprint-report.json"
    argv = ws.yolo_args("train", "footprint", plots="False")
    result = run_python(
        ["-m", "dmlpatch", "run", "--device=sim", f"--report={report}", "yolo", *argv],
        env=ws.env(PYTHONDONTWRITEBYTECODE=""),
    )
    _assert_ok(result)
    kinds: dict[str, list[str]] = {}
    for path in written_between(before, file_stamps(*roots)):
        kinds.setdefault(_footprint_kind(Path(path), purelib, cache, ws), []).append(path)
    assert "unexpected" not in kinds, kinds["unexpected"]
    assert kinds["program output"]  # (ultralytics' spec rewrites no module: no tagged .pyc)
    record_property(
        "terminal_summary",
        "footprint of `dmlpatch run yolo ... mode=train`: "
        + "; ".join(f"{kind}: {len(files)} file(s)" for kind, files in sorted(kinds.items())),
    )


def _footprint_kind(path: Path, purelib: Path, cache: Path, ws: Workspace) -> str:
    if path.is_relative_to(cache):
        return "dmlpatch: cache directory (simulator build, plans)"
    if path.parent.name == "__pycache__" and ".opt-dmlpatch" in path.name:
        return "dmlpatch: rewritten bytecode (tagged .pyc beside the source)"
    if path.parent.name == "__pycache__" and path.suffix == ".pyc":
        return "python: its own bytecode cache"
    if path.is_relative_to(ws.runs) or path.name in ("footprint-report.json", "network.log"):
        return "program output"
    if path.is_relative_to(ws.config):
        return "ultralytics: its settings"
    if path.is_relative_to(ws.data) or path.is_relative_to(ws.data.parent):
        return "ultralytics: its dataset label cache"
    return "unexpected"


def test_ultralytics_files_unchanged(ws: Workspace) -> None:
    """After every run above: each installed ultralytics file has its sha256 from before, and
    so has every file of torch and torchvision."""
    assert len(ws.installed) == 2, f"ultralytics 8.1 missing; install it first: {OLD_INSTALL}"
    for path, before in ws.installed.items():
        assert _digest(path) == before
    assert distribution_digests("torch", "torchvision") == ws.torch_files


# -- device-side NMS ---------------------------------------------------------------------------

_coordinate = st.integers(min_value=0, max_value=40)


@example(rows=[(0, 0, 1, 1, 0)] * 20 + [(0, 0, 7, 18, 0), (0, 0, 20, 21, 0)], threshold=0.3)
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            _coordinate, _coordinate, st.integers(1, 24), st.integers(1, 24), st.integers(0, 9)
        ),
        max_size=40,
    ),
    st.sampled_from([0.0, 0.3, 0.5, 0.7, 1.0]),
)
def test_greedy_nms_is_torchvision_nms(
    rows: list[tuple[int, int, int, int, int]], threshold: float
) -> None:
    boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h, _ in rows], dtype=torch.float32)
    boxes = boxes.reshape(-1, 4)
    # Scores with ties, as detections of an untrained model have.
    scores = torch.tensor([s / 10 for *_, s in rows], dtype=torch.float32)
    expected = torchvision.ops.nms(boxes, scores, threshold)
    assert torch.equal(greedy_nms(boxes, scores, threshold), expected)


def test_greedy_nms_blocks_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    from dmlpatch.opfix.vision import detection_costs

    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(300, 2, generator=generator) * 100
    boxes = torch.cat((corners, corners + torch.rand(300, 2, generator=generator) * 30 + 1), 1)
    scores = torch.rand(300, generator=generator)
    expected = torchvision.ops.nms(boxes, scores, 0.4)
    monkeypatch.setattr(detection_costs, "BLOCK", 7)  # many row blocks, one partial
    assert torch.equal(greedy_nms(boxes, scores, 0.4), expected)


# -- dmlpatch check on the seed's training run --------------------------------------------------


def test_check_says_the_seed_run_works_on_directml(ws: Workspace, tmp_path: Path) -> None:
    """The op-gap report for the seed's `yolo ... mode=train`: every gap it meets is fixed on
    the device (unique with counts, the EMA's lerp, SiLU's backward, ...), nothing falls back."""
    script = tmp_path / "yolo_cli.py"
    script.write_text(YOLO[1].replace("; ", "\n"))
    report = tmp_path / "check.json"
    args = ws.yolo_args("train", "check")
    result = run_python(
        ["-m", "dmlpatch", "check", "--device", "sim", f"--json={report}", str(script), *args],
        env=ws.env(),
    )
    _assert_ok(result)
    data = json.loads(report.read_text())
    rows = {row["op"]: row for row in data["ops"]}
    assert {row["how"] for row in rows.values()} == {"fixed"}
    assert rows["aten::_unique2"]["first_call"].endswith("ultralytics/utils/loss.py:400")
    assert rows["aten::lerp.Scalar_out"]["calls"] > 0
    assert "verdict: runs on DirectML with 0 fallbacks costing 0 copies" in result.err
    # Every convolution, batch norm and product of training, validation and the final
    # validation of best.pt ran on the device, forward and backward.
    compute = data["compute"]
    assert compute["on_cpu"] == {"calls": 0, "flops": 0} and compute["cpu_lines"] == []
    assert compute["device_share"] == 1.0
    # Heavy calls on the device: two training steps forward and backward, then validations.
    assert compute["on_device"]["calls"] > 100
    assert "model compute: all model compute" in result.err
