"""The checkpoint ultralytics' AMP check downloads, built offline: random weights, real format.

``check_amp`` loads ``yolo26n.pt`` (8.4) or ``yolov8n.pt`` (8.1) from the settings' weights
directory, runs it on ``bus.jpg`` in float32 and under autocast, and passes when the boxes of the
two runs agree within half a pixel (of the original image). This script writes that file for
the ultralytics it runs with: the architecture of ``yolo26n.yaml`` / ``yolov8n.yaml`` with
ultralytics' random initialisation, saved as a training run saves it and stripped by
ultralytics' own ``strip_optimizer`` (float16 model, ``epoch=-1``, default ``train_args``), so
the loader reads it as it reads a release file. It points the settings' ``weights_dir`` at the
directory.

A trained detector is what the check's tolerance is made for: its features have a scale float16
holds, small errors in them stay small, and a few boxes score clearly above the threshold.
Random weights have none of that, so three changes give the random model those properties:

- BatchNorm statistics measured on ultralytics' sample images (``bus.jpg``, ``zidane.jpg``).
  With fresh ones (mean 0, variance 1) each layer shrinks its input in evaluation, and the
  head's features reach 1e-8 to 1e-12: below float16's range and far below the class biases
  (-8.8 to -11.5), so float32 and float16 both find no box and agree without comparing
  anything (``conditioning="fresh"``).
- Measured statistics alone make a chaotic network: a relative error of 1e-5 on each
  convolution's output, a twentieth of float16's rounding, moves its boxes by 0.7 px in float32
  on the CPU, and float16's rounding by 13 px and more, reordering them
  (``conditioning="measured"``: the check fails there, on the CPU's float16 as on any device).
  Scaling each BatchNorm's weight outside the head by ``GAIN`` (0.9) after measuring puts the
  network in the ordered regime a trained one is in (the head's statistics are measured again,
  so its features keep their scale): float16's rounding then moves the boxes by about 0.2 px
  (``conditioning="ordered"``, the default). The box branches' last weights are halved
  (``BOX_GAIN``): random regressions make boxes as large as the image, whose float16 rounding
  alone is 0.3 to 0.45 px (it grows with a box's size), which left the verdict to the order in
  which a BatchNorm's statistics were summed (one thread or two); halved, about 0.18 px.
- The class biases moved by one common amount, so that the best-scoring detections of
  ``bus.jpg`` in float32 (after ultralytics' own NMS or top-k) are above the check's confidence
  (0.25) and the next one below it, the threshold half-way between them. One shift keeps every
  score's order. Random scores crowd together (the best six within 0.05 of each other), and
  the check compares the boxes in score order, so only detections that stand ``GAP`` apart
  from the next are kept above the threshold (up to ``BOXES``), as a trained detector's
  confident boxes stand apart; otherwise float16's rounding reorders two of them.

usage: amp_weights.py WEIGHTS_DIR [ordered|measured|fresh]
"""

from __future__ import annotations

import math
import sys
from copy import deepcopy
from pathlib import Path

import cv2
import numpy as np
import torch

#: Detections above the check's confidence in float32, at most.
BOXES = 6
#: The least difference between the logits of consecutive detections kept (and the first left).
GAP = 0.03
#: ultralytics' confidence threshold for predictions (``conf`` default).
CONFIDENCE = 0.25
#: Each BatchNorm weight outside the head, times this after its statistics are measured.
GAIN = 0.9
#: The weights of the box branches' last convolutions, times this.
BOX_GAIN = 0.5


def main(weights_dir: Path, conditioning: str = "ordered") -> None:
    import ultralytics
    from ultralytics import YOLO
    from ultralytics.utils import ASSETS, SETTINGS

    old = ultralytics.__version__.startswith(("8.0.", "8.1."))
    name, config = ("yolov8n.pt", "yolov8n.yaml") if old else ("yolo26n.pt", "yolo26n.yaml")
    imgsz = 640 if old else 256  # the size each line's check predicts at
    weights_dir.mkdir(parents=True, exist_ok=True)
    SETTINGS.update({"weights_dir": str(weights_dir)})
    target = weights_dir / name

    torch.manual_seed(0)
    model = YOLO(config).model
    if conditioning != "fresh":
        _condition(model, [ASSETS / "bus.jpg", ASSETS / "zidane.jpg"], imgsz, conditioning)
    _save(model, target)
    found = YOLO(target)(ASSETS / "bus.jpg", imgsz=imgsz, conf=1e-4, device="cpu", verbose=False)
    logits = sorted((_logit(float(s)) for s in found[0].boxes.conf), reverse=True)
    kept = _standing_out(logits) if conditioning != "fresh" else 0
    if kept:
        shift = _logit(CONFIDENCE) - (logits[kept - 1] + logits[kept]) / 2
        with torch.no_grad():
            for module_name, module in model.model[-1].named_modules():
                # The last convolution of each class branch is its only one with a bias.
                if "cv3" in module_name and _biased_convolution(module):
                    module.bias += shift
        _save(model, target)
        logits = [value + shift for value in logits]
    scores = [round(1 / (1 + math.exp(-v)), 4) for v in logits[: kept + 1]]
    print(f"{target} ({conditioning}): {kept} boxes, float32 scores {scores}")


def _standing_out(logits: list[float]) -> int:
    """The most detections, up to ``BOXES``, whose scores are each ``GAP`` apart (in logits)
    from the next one down: neither their order nor which of them pass the threshold is left
    to float16's rounding of a score (about 0.005 in logits here)."""
    for count in range(BOXES, 0, -1):
        if all(logits[i] - logits[i + 1] >= GAP for i in range(count)):
            return count
    raise SystemExit("no detection stands out of the next one down by GAP")


def _biased_convolution(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Conv2d) and module.bias is not None


def _logit(probability: float) -> float:
    return math.log(probability / (1 - probability))


def _condition(model: torch.nn.Module, images: list[Path], imgsz: int, conditioning: str) -> None:
    batch = []
    for path in images:
        image = cv2.resize(cv2.imread(str(path)), (imgsz, imgsz), interpolation=cv2.INTER_LINEAR)
        batch.append(torch.from_numpy(np.ascontiguousarray(image[..., ::-1].transpose(2, 0, 1))))
    x = torch.stack(batch).float() / 255
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    _measure(model, x, norms)
    if conditioning == "ordered":
        with torch.no_grad():
            for module_name, module in model.model[-1].named_modules():
                # The last convolution of each box branch is its only one with a bias.
                if "cv2" in module_name and _biased_convolution(module):
                    module.weight *= BOX_GAIN
        in_head = {id(m) for m in model.model[-1].modules()}
        with torch.no_grad():
            for norm in norms:
                if id(norm) not in in_head:
                    norm.weight *= GAIN
        _measure(model, x, [norm for norm in norms if id(norm) in in_head])


def _measure(model: torch.nn.Module, x: torch.Tensor, norms: list[torch.nn.BatchNorm2d]) -> None:
    """The running statistics of ``norms`` averaged over ``x``, the other layers evaluating."""
    momentum = [norm.momentum for norm in norms]
    model.eval()
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average
        norm.train()
    with torch.no_grad():
        model(x)
    for norm, kept in zip(norms, momentum):
        norm.momentum = kept
    model.eval()


def _save(model: torch.nn.Module, target: Path) -> None:
    """A training checkpoint, stripped as ultralytics strips its releases."""
    from ultralytics.utils.torch_utils import strip_optimizer

    torch.save({"model": deepcopy(model), "ema": None, "train_args": {}}, target)
    strip_optimizer(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
