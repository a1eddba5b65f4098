# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# fmt: off
"""Code that says ``cuda`` without naming a device: none of it may change."""

import torch

NAMES = {"cuda": "NVIDIA GPU", "cpu": "processor"}
AMP = dict(device_type="cuda", enabled=False)
device_name = "cuda"
LOADER = dict(batch_size=8, pin_memory=True)  # DataLoader pins only where CUDA is


def describe(x, mode="cuda"):
    log = ["using cuda"]
    if x.device.type == "cuda":
        log.append("on a GPU")
    if "cuda" in str(x.device):
        log.append("cuda-ish")
    if x.is_cuda or x.device.type != "cuda":
        log.append(NAMES.get(x.device.type, "other"))
    log.append(f"{mode} arch list: {len(torch.cuda.get_arch_list()) >= 0}")
    log.append(str(torch.cuda.is_initialized()))
    log.append(str(torch.backends.cudnn.enabled))
    log.append(str(callable(torch.Tensor.pin_memory)))
    return log


def run() -> dict:
    return {"log": describe(torch.zeros(1)), "amp": AMP, "name": device_name}
