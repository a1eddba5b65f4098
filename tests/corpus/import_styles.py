# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: E501
# fmt: off
"""Every way a module gets at ``torch.cuda`` and ``torch.device``."""

import torch as th
import torch.cuda
from torch import cuda
from torch import device as make_device
from torch.cuda import device_count as gpu_count


def run() -> dict:
    return {
        "available": torch.cuda.is_available(),  # site: is_available
        "aliased": th.cuda.is_available(),  # site: is_available
        "count": cuda.device_count(),  # site: cuda_api
        "imported": gpu_count(),  # site: cuda_api
        "device": str(make_device("cuda" if cuda.is_available() else "cpu")),  # site: device_literal, is_available
    }
