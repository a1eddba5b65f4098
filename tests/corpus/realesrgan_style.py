# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: E501
# fmt: off
"""realesrgan's shape: ``f'cuda:{gpu_id}'`` when a GPU id is given, else cuda-else-cpu."""

import torch


class RealESRGANer:
    def __init__(self, scale, gpu_id=None, device=None):
        self.scale = scale
        if gpu_id:
            self.device = (
                torch.device(
                    f"cuda:{gpu_id}" if torch.cuda.is_available() else "cpu"  # site: device_literal, is_available
                )
                if device is None
                else device
            )
        else:
            self.device = (
                torch.device("cuda" if torch.cuda.is_available() else "cpu")  # site: device_literal, is_available
                if device is None
                else device
            )

    def enhance(self, image):
        return torch.nn.functional.interpolate(image.to(self.device), scale_factor=self.scale)  # site: device_argument


def run() -> dict:
    first = RealESRGANer(2)
    second = RealESRGANer(2, gpu_id=1)
    out = first.enhance(torch.arange(4.0).reshape(1, 1, 2, 2))
    return {
        "device": str(first.device),
        "gpu_id_device": str(second.device),
        "out": out.flatten().tolist(),
    }
