"""Offline fixtures for the Ultralytics workflow: a tiny synthetic detection dataset and config.

- ``build_dataset(root)``: 8 train and 4 val 64x64 JPEG images, each with one to three filled
  rectangles (class 0) or discs (class 1), YOLO-format labels, and ``data.yaml``;
- ``build_config_dir(root)``: a ``YOLO_CONFIG_DIR`` with a font as ``Ultralytics/Arial.ttf``
  (8.2+) and ``Arial.ttf`` (8.0/8.1 look there): matplotlib's DejaVuSans, which ultralytics
  would otherwise download for its plots;
- ``offline_env(...)``: the environment for a subprocess: ``YOLO_OFFLINE=true``, that config
  directory, and ``netblock/`` first on ``PYTHONPATH`` so any network attempt is refused and
  logged (``netlog``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

import cv2
import numpy as np

from support import clean_env

HERE = Path(__file__).resolve().parent
NETBLOCK = HERE / "netblock"
SIZE = 64
SPLITS = {"train": 8, "val": 4}
NAMES = {0: "box", 1: "disc"}


def build_dataset(root: Path, seed: int = 0) -> Path:
    """Write images, labels and ``data.yaml`` under ``root``; returns the yaml's path."""
    rng = np.random.default_rng(seed)
    for split, count in SPLITS.items():
        images = root / "images" / split
        labels = root / "labels" / split
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            image, rows = _scene(rng)
            cv2.imwrite(str(images / f"{split}{index}.jpg"), image)
            (labels / f"{split}{index}.txt").write_text("".join(rows), encoding="utf-8")
    data = root / "data.yaml"
    names = "".join(f"  {k}: {v}\n" for k, v in NAMES.items())
    data.write_text(
        f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}", encoding="utf-8"
    )
    return data


def _scene(rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    image = np.full((SIZE, SIZE, 3), rng.integers(0, 80), dtype=np.uint8)
    rows = []
    for _ in range(int(rng.integers(1, 4))):
        cls = int(rng.integers(0, 2))
        w, h = (int(v) for v in rng.integers(12, 28, size=2))
        x0, y0 = int(rng.integers(0, SIZE - w)), int(rng.integers(0, SIZE - h))
        color = tuple(int(c) for c in rng.integers(120, 256, size=3))
        if cls == 0:
            cv2.rectangle(image, (x0, y0), (x0 + w - 1, y0 + h - 1), color, thickness=-1)
        else:
            cv2.ellipse(image, (x0 + w // 2, y0 + h // 2), (w // 2, h // 2), 0, 0, 360, color, -1)
        cx, cy = (x0 + w / 2) / SIZE, (y0 + h / 2) / SIZE
        rows.append(f"{cls} {cx:.6f} {cy:.6f} {w / SIZE:.6f} {h / SIZE:.6f}\n")
    return image, rows


def build_config_dir(root: Path) -> Path:
    """A ``YOLO_CONFIG_DIR`` whose font is already there (no download for plots)."""
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    for target in (root / "Ultralytics" / "Arial.ttf", root / "Arial.ttf"):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(font, target)
    return root


def offline_env(
    config_dir: Path, netlog: Path, pythonpath: Optional[list[Path]] = None, **extra: str
) -> dict[str, str]:
    """A clean environment for an offline ultralytics subprocess with sockets blocked."""
    paths = [*(pythonpath or []), NETBLOCK]
    settings = {
        # 8.0/8.1 compare YOLO_OFFLINE with "true"; 8.4 accepts "true" as well.
        "YOLO_OFFLINE": "true",
        "YOLO_CONFIG_DIR": str(config_dir),
        "YOLO_TEST_NETLOG": str(netlog),
        "PYTHONPATH": os.pathsep.join(str(p) for p in paths),
    }
    return clean_env(**{**settings, **extra})
