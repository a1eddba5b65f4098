# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: E501, UP032
# fmt: off
"""Device names held in variables, attributes, options and ``map_location``."""

import argparse
import io

import torch

device = "cuda"  # site: device_literal
DEFAULT_DEVICE: str = "cuda:0"  # site: device_literal


class Config:
    def __init__(self, index=0):
        self.device = "cuda:0"  # site: device_literal
        self.eval_device = f"cuda:{index}" if index >= 0 else "cpu"  # site: device_literal
        self.save_device = "cuda:" + str(index)  # site: device_literal
        self.backend = "cuda"


def parse(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")  # site: device_literal
    parser.add_argument("--backend", default="cuda")
    return parser.parse_args(argv)


def load(buffer, map_location="cuda"):  # site: device_literal
    return torch.load(buffer, map_location=map_location, weights_only=True)  # site: device_argument


def run() -> dict:
    buffer = io.BytesIO()
    torch.save(torch.arange(3.0), buffer)
    buffer.seek(0)
    loaded = load(buffer)
    buffer.seek(0)
    again = torch.load(buffer, map_location="cuda:{}".format(0), weights_only=True)  # site: device_literal
    config = Config()
    return {
        "names": [device, DEFAULT_DEVICE, config.device, config.eval_device, config.save_device],
        "backend": config.backend,
        "option": parse([]).device,
        "explicit": parse(["--device", "cpu"]).device,
        "loaded": [str(loaded.device), loaded.tolist(), str(again.device)],
    }
