"""YOLO training with ``amp=True``, instrumented: what precision each step ran in, and its losses.

Run plainly (``device=cpu``, where ultralytics trains in float32: its AMP is for accelerators)
or as ``python -m dmlpatch --device sim train_amp.py ... dml``. Writes one JSON document:

- ``amp``: the trainer's verdict after ``check_amp`` (``trainer.amp``);
- ``steps``: per training step, the losses, the dtype of the first convolution's output in the
  forward pass, and the GradScaler's scale after the step;
- ``scaler``: whether the trainer's GradScaler is enabled and for which device type;
- ``first_step`` (off the CPU only): the first step's losses computed again on the CPU, from the
  same weights and batch, in float32 and under the CPU's own float16 autocast: what the
  device's first step is compared with before training moves the weights apart.

usage: train_amp.py DATA_YAML PROJECT OUT_JSON DEVICE EPOCHS
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer

STEPS: list[dict[str, Any]] = []
SEEN: list[str] = []
FIRST_STEP: dict[str, dict[str, float]] = {}


def _losses(trainer: Any, items: Any) -> dict[str, float]:
    # 8.4: a dict by name; 8.1: a tensor in the order of loss_names.
    pairs = items.items() if isinstance(items, dict) else zip(trainer.loss_names, items.tolist())
    return {k: round(float(v), 6) for k, v in pairs}


class AmpTrainer(DetectionTrainer):
    def preprocess_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        batch = super().preprocess_batch(batch)
        if not FIRST_STEP and self.device.type != "cpu":
            on_cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            for name, dtype in (("float32", None), ("float16", torch.float16)):
                model = copy.deepcopy(self.model).cpu()
                with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=bool(dtype)):
                    _, items = model(on_cpu)
                FIRST_STEP[name] = _losses(self, items)
        return batch


def on_train_start(trainer: Any) -> None:
    first = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
    first.register_forward_hook(lambda module, inputs, output: SEEN.append(str(output.dtype)))


def on_train_batch_end(trainer: Any) -> None:
    STEPS.append(
        {
            "losses": _losses(trainer, trainer.loss_items),
            "dtype": SEEN[-1],
            "scale": trainer.scaler.get_scale(),
        }
    )


def main(data: str, project: str, out: str, device: str, epochs: str) -> None:
    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_train_batch_end", on_train_batch_end)
    model.train(
        trainer=AmpTrainer,
        data=data,
        epochs=int(epochs),
        imgsz=64,
        batch=4,
        workers=0,
        seed=1,
        deterministic=True,
        device=device,
        amp=True,
        project=project,
        name="amp",
        exist_ok=True,
        plots=False,
        val=False,
    )
    trainer = model.trainer
    Path(out).write_text(
        json.dumps(
            {
                "amp": bool(trainer.amp),
                "steps": STEPS,
                "scaler": {
                    "enabled": trainer.scaler.is_enabled(),
                    "device": str(getattr(trainer.scaler, "_device", "")),
                },
                "first_step": FIRST_STEP,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:6])
