"""ultralytics' AMP check on one device, with the weights ``amp_weights.py`` wrote.

- ``amp_check.py dml``: ``check_amp`` itself, for a model on the DirectML device (run under
  ``python -m dmlpatch --device sim``); with ``--no-autocast`` dmlpatch's kernels are removed
  first (``opfix.uninstall()``), as where they could not be installed.
- ``amp_check.py cpu``: the check's comparison on the CPU, whose own ``check_amp`` answers False
  without comparing: the same model, images, size and tolerance, float32 against the CPU's
  float16 autocast. The reference for the device's verdict.

Prints one JSON line: ``verdict``, and on the CPU the boxes of each run and their largest
difference.
"""

from __future__ import annotations

import json
import sys

import torch
import ultralytics
from ultralytics import YOLO
from ultralytics.utils import ASSETS, WEIGHTS_DIR
from ultralytics.utils.checks import check_amp

OLD = ultralytics.__version__.startswith(("8.0.", "8.1."))


def on_device(remove_autocast: bool) -> dict[str, object]:
    if remove_autocast:
        from dmlpatch.opfix import installer

        installer.uninstall()
    model = YOLO("yolov8n.yaml").model.to("privateuseone:0")
    return {"verdict": bool(check_amp(model))}


def on_cpu() -> dict[str, object]:
    """8.4's amp_allclose: 8 images at 256; 8.1's: one image at the default size (640)."""
    model = YOLO(WEIGHTS_DIR / ("yolov8n.pt" if OLD else "yolo26n.pt"))
    images, size = ([ASSETS / "bus.jpg"], 640) if OLD else ([ASSETS / "bus.jpg"] * 8, 256)
    a = model(images, imgsz=size, device="cpu", verbose=False)[0].boxes.data
    with torch.autocast("cpu", dtype=torch.float16):
        b = model(images, imgsz=size, device="cpu", verbose=False)[0].boxes.data
    same_shape = a.shape == b.shape
    return {
        "verdict": bool(same_shape and torch.allclose(a, b.float(), atol=0.5)),
        "boxes": [len(a), len(b)],
        "max_diff": float((a - b.float()).abs().max()) if same_shape and len(a) else None,
    }


if __name__ == "__main__":
    device = sys.argv[1]
    result = on_cpu() if device == "cpu" else on_device("--no-autocast" in sys.argv)
    print(json.dumps(result))
