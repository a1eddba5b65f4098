"""yolov5 7.0.14 (the pip form of ultralytics' YOLOv5 repository) on DirectML.

Its ``select_device`` ends with ``arg = 'cuda:0'`` ... ``return torch.device(arg)``, and asserts
a CUDA device for anything but ``cpu``/``mps``: without dmlpatch, ``--device 0`` dies in the
first ``.to(device)`` (``Found no NVIDIA driver``) and ``--device dml`` in the assertion. With it,
``''``, ``'0'`` and ``'dml'`` give the DirectML adapter, and a YOLOv5n trained from its bundled
yaml on a tiny random dataset (one epoch, in mixed precision once yolov5's own AMP check passes
on the device) has the CPU's float32 losses within float16's tolerance; detect runs on the
weights.

The package and the modules it imports at start-up live in ``.cache/yolov5-7.0.14`` (see
scripts/setup.sh); ``$DMLPATCH_YOLOV5`` may point elsewhere.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from support import REPO, clean_env, run_python

SITE = Path(os.environ.get("DMLPATCH_YOLOV5", str(REPO / ".cache" / "yolov5-7.0.14")))

MAKE_DATA = """
import sys
from pathlib import Path
import numpy as np
from PIL import Image

root = Path(sys.argv[1])
rng = np.random.default_rng(0)
for folder in ("images/train", "labels/train"):
    (root / folder).mkdir(parents=True)
for i in range(8):
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
        root / "images/train" / f"im{i}.jpg")
    (root / "labels/train" / f"im{i}.txt").write_text(
        f"{i % 2} 0.3 0.3 0.2 0.2\\n{(i + 1) % 2} 0.7 0.6 0.3 0.25\\n")
(root / "tiny.yaml").write_text(
    f"path: {root}\\ntrain: images/train\\nval: images/train\\nnc: 2\\nnames: ['a', 'b']\\n")
"""

SELECT = """
import json, sys
from yolov5.utils.torch_utils import select_device
print(json.dumps([str(select_device(request)) for request in sys.argv[1:]]))
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    assert (SITE / "yolov5").is_dir(), "install it first: bash scripts/setup.sh"
    root = tmp_path_factory.mktemp("yolov5")
    config = root / "config"
    config.mkdir()
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    shutil.copy(font, config / "Arial.ttf")  # check_font would download Arial.ttf
    env = clean_env(
        PYTHONPATH=str(SITE),
        YOLOV5_CONFIG_DIR=str(config),
        YOLO_CONFIG_DIR=str(root / "ultralytics"),
        YOLO_OFFLINE="1",
        # train.py asks ultralytics to check requirements.txt, which the wheel does not ship.
        ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS="1",
        # yolov5 7.0.14 reloads its own checkpoints with torch.load's pre-2.6 default, as on
        # torch-directml's torch 2.4.1.
        TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
        MPLBACKEND="Agg",
        WANDB_MODE="disabled",
        COMET_MODE="disabled",
    )
    made = run_python(["-c", MAKE_DATA, str(root / "data")], env=env)
    assert made.code == 0, made.err
    return root, env


def _train(root: Path, env: dict[str, str], name: str, device: str, dmlpatch: bool) -> dict:
    report = root / f"{name}.json"
    runner = ["-m", "dmlpatch", "--device", "sim", f"--report={report}"] if dmlpatch else []
    command = [*runner, "-m", "yolov5.train", "--cfg", "yolov5n.yaml", "--weights", ""]
    command += ["--data", str(root / "data" / "tiny.yaml"), "--epochs", "1", "--img", "64"]
    command += ["--batch", "4", "--device", device, "--workers", "0", "--noplots"]
    command += ["--project", str(root / "runs"), "--name", name, "--exist-ok"]
    result = run_python(command, env=env, cwd=root, timeout=600)
    assert result.code == 0, result.err[-3000:]
    with open(root / "runs" / name / "results.csv", newline="") as handle:
        row = {key.strip(): value.strip() for key, value in next(csv.DictReader(handle)).items()}
    return {
        "losses": [
            float(row[key]) for key in ("train/box_loss", "train/obj_loss", "train/cls_loss")
        ],
        "log": result.err,
        "report": json.loads(report.read_text()) if dmlpatch else None,
    }


def test_train_on_the_device_equal_to_cpu_then_detect(
    workspace: tuple[Path, dict[str, str]],
) -> None:
    root, env = workspace
    expected = _train(root, env, "cpu", "cpu", dmlpatch=False)
    got = _train(root, env, "dml", "0", dmlpatch=True)
    assert "DML:0 (Simulated Radeon (discrete))" in got["log"]
    # yolov5's own AMP check passes on the device, so the epoch trains in float16 autocast
    # with a GradScaler there: its losses within float16's tolerance of the CPU's float32
    amp_lines = [line for line in got["log"].splitlines() if "AMP: " in line]
    assert len(amp_lines) == 1 and amp_lines[0].endswith("checks passed ✅"), amp_lines
    assert got["report"]["autocast"]["float16"] > 0
    assert got["report"]["compute"]["device"] == "privateuseone:0"
    assert got["report"]["compute"]["device_share"] == 1.0
    assert got["losses"] == pytest.approx(expected["losses"], rel=1e-2)
    weights = root / "runs" / "dml" / "weights" / "best.pt"
    detect = ["-m", "dmlpatch", "--device", "sim", f"--report={root / 'detect.json'}"]
    detect += ["-m", "yolov5.detect", "--weights", str(weights), "--img", "64", "--device", "dml"]
    detect += ["--source", str(root / "data" / "images" / "train" / "im0.jpg")]
    detect += ["--project", str(root / "runs"), "--name", "detect", "--conf-thres", "0.0001"]
    result = run_python(detect, env=env, cwd=root, timeout=300)
    assert result.code == 0, result.err[-3000:]
    compute = json.loads((root / "detect.json").read_text())["compute"]
    assert compute["device_share"] == 1.0, compute
    assert (root / "runs" / "detect" / "im0.jpg").is_file()


def test_select_device_requests(workspace: tuple[Path, dict[str, str]]) -> None:
    root, env = workspace
    script = root / "choose.py"
    script.write_text(SELECT)
    requests = ["", "0", "cuda:0", "dml", "dml:0", "cpu"]
    result = run_python(["-m", "dmlpatch", "--device", "sim", str(script), *requests], env=env)
    assert result.code == 0, result.err[-3000:]
    # ultralytics (which yolov5 imports) says first that it made its settings file.
    assert json.loads(result.out.splitlines()[-1]) == ["privateuseone:0"] * 5 + ["cpu"]
    assert result.err.count("DML:0 (Simulated Radeon (discrete))") == 5
    without = run_python([str(script), "dml"], env=env)
    assert without.code == 1
    assert "AssertionError: Invalid CUDA '--device dml' requested" in without.err
