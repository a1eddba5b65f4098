"""The Python-API workflow, instrumented: ``YOLO(...).train/val/predict`` on one device.

Run plainly (``device=cpu``) or as ``python -m dmlpatch --device sim train_api.py ...``; it
writes one JSON document with, per training step, the losses and — on the simulated device —
the host/device copies of each phase of the step:

- ``batch``: ``preprocess_batch``, which moves the loader's batch to the device;
- ``compute``: forward, loss, backward and optimizer, up to the progress line;
- ``logging``: the progress line (memory and running losses) until the step ends.

It also records the device of every convolution's input and weight during training. This is a
user's script (a custom trainer is ultralytics' own extension point), not a stand-in for it.

usage: train_api.py DATA_YAML PROJECT OUT_JSON DEVICE AMP
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer


def _counters() -> dict[str, int]:
    simulated = sys.modules.get("dmlpatch.sim")
    if simulated is None or not simulated.is_loaded():
        return {}
    counters = simulated.counters()
    copies = {k: v["count"] for k, v in counters["transfers"].items()}
    copies["fallback"] = sum(counters["ops"]["fallback"].values())
    copies["refused"] = sum(counters["ops"]["refused"].values())
    return copies


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


class Recorder:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.marks: dict[str, dict[str, int]] = {}
        self.conv_devices: set[str] = set()

    def mark(self, name: str) -> None:
        self.marks[name] = _counters()


RECORDER = Recorder()


class MeasuredTrainer(DetectionTrainer):
    def preprocess_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        RECORDER.mark("batch")
        batch = super().preprocess_batch(batch)
        RECORDER.mark("compute")
        return batch

    def _get_memory(self, fraction: bool = False) -> float:
        if not fraction:
            RECORDER.mark("logging")
        return super()._get_memory(fraction)


def on_train_start(trainer: Any) -> None:
    def record(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        RECORDER.conv_devices.add(f"{inputs[0].device} {module.weight.device}")

    for module in trainer.model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_pre_hook(record)


def on_train_batch_end(trainer: Any) -> None:
    RECORDER.mark("end")
    marks = RECORDER.marks
    copies = {}
    if marks["end"]:
        copies = {
            "batch": _delta(marks["compute"], marks["batch"]),
            "compute": _delta(marks["logging"], marks["compute"]),
            "logging": _delta(marks["end"], marks["logging"]),
        }
    losses = {k: round(float(v), 6) for k, v in trainer.loss_items.items()}
    RECORDER.steps.append({"losses": losses, "copies": copies})


def main(data: str, project: str, out: str, device: str, amp: str) -> None:
    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_train_batch_end", on_train_batch_end)
    model.train(
        trainer=MeasuredTrainer,
        data=data,
        epochs=1,
        imgsz=64,
        batch=4,
        workers=0,
        seed=1,
        deterministic=True,
        device=device,
        amp=amp == "True",
        project=project,
        name="api",
        exist_ok=True,
        plots=False,
    )
    parameters = {str(p.device) for p in model.trainer.model.parameters()}
    metrics = model.val(data=data, imgsz=64, batch=4, device=device, plots=False)
    images = Path(data).parent / "images" / "val"
    results = model.predict(source=str(images), imgsz=64, device=device, conf=0.001)
    # A user's own inference mode around the predictor (DirectML refuses the model's parameters
    # inside it: microsoft/DirectML#602).
    with torch.inference_mode():
        again = model.predict(source=str(images), imgsz=64, device=device, conf=0.001)
    Path(out).write_text(
        json.dumps(
            {
                "steps": RECORDER.steps,
                "conv_devices": sorted(RECORDER.conv_devices),
                "parameters": sorted(parameters),
                "val_fitness": float(metrics.fitness),
                "predicted": [len(r.boxes) for r in results],
                "predicted_in_inference_mode": [len(r.boxes) for r in again],
                "predict_device": str(results[0].boxes.data.device),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:6])
