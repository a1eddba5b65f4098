"""facexlib 0.2.x (early 2024): RetinaFace's device is chosen once, at module level.

``facexlib/detection/retinaface.py`` (0.2.5, line 14) sets ``device = torch.device('cuda' if
torch.cuda.is_available() else 'cpu')`` and moves every tensor it makes there, whatever device
its caller gave ``init_detection_model``. The spec's ``<0.3`` entry rewrites that line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support import run_python

DETECT = """
import json, sys, cv2, torch
import dmlpatch.sim

dmlpatch.sim.load()
import facexlib
from facexlib.detection import init_detection_model, retinaface

device = torch.device(sys.argv[3])
model = init_detection_model("retinaface_resnet50", device=device, model_rootpath=sys.argv[2])
with torch.no_grad():
    faces = model.detect_faces(cv2.imread(sys.argv[1]), 0.97)
ops = dmlpatch.sim.counters()["ops"]
print(json.dumps({
    "version": facexlib.__version__,
    "file": facexlib.__file__,
    "module_device": str(retinaface.device),
    "model": sorted({str(p.device) for p in model.parameters()}),
    "faces": [[round(float(x), 3) for x in face] for face in faces],
    "convs": ops["native"].get("aten::convolution_overrideable", 0),
    "fallback": ops["fallback"],
    "refused": ops["refused"],
}))
"""


def test_module_level_device_is_rewritten(assets, facexlib_0_2_5: Path, tmp_path: Path) -> None:
    script = tmp_path / "detect.py"
    script.write_text(DETECT)
    image = str(assets.root / "inputs" / "whole" / "portrait.png")
    weights = str(assets.root / "gfpgan" / "weights")
    env = assets.env(PYTHONPATH=f"{facexlib_0_2_5}:{assets.site}")
    report = tmp_path / "report.json"

    def detect(device: str, *prefix: str) -> dict[str, Any]:
        result = run_python([*prefix, str(script), image, weights, device], env=env, timeout=600)
        assert result.code == 0, result.err
        return json.loads(result.out.splitlines()[-1])

    patched = detect("privateuseone:0", "-m", "dmlpatch", "--device", "sim", f"--report={report}")
    assert patched["version"] == "0.2.5"
    assert patched["file"].startswith(str(facexlib_0_2_5))
    assert patched["module_device"] == "privateuseone:0"
    assert patched["model"] == ["privateuseone:0"]
    assert patched["convs"] > 50 and patched["fallback"] == {} and patched["refused"] == {}
    rewritten = json.loads(report.read_text())["patches"]["facexlib"]["modules"]
    modules = {entry["module"]: entry["sites"] for entry in rewritten}
    # Its module-level device, and the eight places it hands that device to torch.
    assert modules["facexlib.detection.retinaface"] == 10
    # the 0.2.x entry (.cuda() calls), and the device its load() hands to torch
    assert modules["facexlib.alignment.awing_arch"] == 8

    # The same detection, plain, on the CPU (0.2.5's own choice there): the same face.
    cpu = detect("cpu")
    assert cpu["module_device"] == "cpu" and cpu["convs"] == 0
    assert len(patched["faces"]) == 1
    for got, want in zip(patched["faces"][0], cpu["faces"][0]):
        assert abs(got - want) <= 1e-3

    # Without dmlpatch, asking for the device is not enough: the model goes there, but
    # detect_faces moves the image to the module-level device (the CPU here).
    plain = run_python([str(script), image, weights, "privateuseone:0"], env=env, timeout=600)
    assert plain.code == 1
    assert (
        "RuntimeError: Input type (torch.FloatTensor) and weight type (privateuseoneFloatType) "
        "should be the same" in plain.err
    )
    network = assets.netlog.read_text() if assets.netlog.exists() else ""
    assert network == "", f"network attempted: {network}"
