# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: E501
# fmt: off
"""facexlib's shape: a ``device='cuda'`` default and a helper that picks cuda-else-cpu."""

import torch
from torch import nn


def init_detection_model(model_name, half=False, device="cuda"):  # site: device_literal
    model = nn.Conv2d(3, 2, 3)
    nn.init.constant_(model.weight, 0.5)
    nn.init.zeros_(model.bias)
    model.eval()
    return model.to(device)  # site: device_argument


class FaceRestoreHelper:
    def __init__(self, upscale_factor, face_size=512, device=None):
        self.upscale_factor = upscale_factor
        if device is None:
            self.device = torch.device(
                "cuda" if torch.cuda.is_available() else "cpu"  # site: device_literal, is_available
            )
        else:
            self.device = device
        self.face_det = init_detection_model("retinaface_resnet50", device=self.device)  # site: device_argument

    def detect(self, image):
        with torch.no_grad():
            return self.face_det(image.to(self.device))  # site: device_argument


def run() -> dict:
    helper = FaceRestoreHelper(2)
    default = init_detection_model("retinaface_resnet50")
    image = torch.ones(1, 3, 5, 5)
    with torch.no_grad():
        direct = default(image)
    return {
        "helper_device": str(helper.device),
        "default_device": str(next(default.parameters()).device),
        "helper_sum": helper.detect(image).sum().item(),
        "default_sum": direct.sum().item(),
    }
