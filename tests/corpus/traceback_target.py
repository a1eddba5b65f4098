# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# ruff: noqa: E501
# fmt: off
"""Sites before an error: tracebacks must still point at these lines."""

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # site: device_literal, is_available


def pick(index):
    return torch.device(f"cuda:{index}")  # site: device_literal


def fail():
    x = torch.zeros(1).to("cuda")  # site: device_literal
    raise ValueError(f"failed on {x.device}")  # the raise
