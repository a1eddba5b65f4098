# Corpus of CUDA idioms, written the way the libraries write them. "# site: <kinds>" marks
# each line the rewriter must change; tests/unit/test_rewrite.py reads these markers.
# fmt: off
"""A program that chose CUDA, then tests what it got (tutorials, Lightning, accelerate)."""

import argparse
import os

import torch

AUTOCAST_DTYPES = {"cuda": torch.float16, "cpu": torch.bfloat16}
PINNED = ("cuda", "xpu")


def parse(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")  # site: device_literal
    return parser.parse_args(argv)


def describe(device):
    checks = {}
    checks["eq"] = device.type == "cuda"  # site: cuda_test
    checks["ne"] = device.type != "cuda"  # site: cuda_test
    checks["str"] = str(device) == "cuda:0"  # site: cuda_test
    checks["in"] = device.type in ("cuda", "mps")  # site: cuda_test
    checks["named"] = device.type in PINNED  # site: cuda_test
    checks["contains"] = "cuda" in str(device)  # site: cuda_test
    checks["prefix"] = str(device).startswith("cuda")  # site: cuda_test
    checks["prefixes"] = str(device).startswith(("cuda", "xpu"))  # site: cuda_test
    checks["table"] = str(AUTOCAST_DTYPES[device.type])  # site: cuda_test
    checks["get"] = str(AUTOCAST_DTYPES.get(device.type))  # site: cuda_test
    checks["display"] = {"cuda": "nccl", "cpu": "gloo"}.get(device.type, "?")  # site: cuda_test
    checks["not_cuda"] = device.type == "cpu"
    return checks


class Placed:
    """Something with a ``.to()`` of its own: it tells where it was sent."""

    def to(self, device):
        return str(device)


def run_on(argv):
    args = parse(argv)
    device = torch.device(args.device)  # site: device_value
    found = describe(device)
    found["where"] = device.type
    found["moves_model"] = args.device == "cuda"  # site: cuda_test
    env_device = os.environ.get("CORPUS_DEVICE", "cpu")  # site: device_value
    found["from_env"] = Placed().to(env_device)  # site: device_argument
    found["from_args"] = Placed().to(args.device)  # site: device_argument
    return found


def run():
    found = run_on([])
    # Plain python on a machine without CUDA stops here, as the program would.
    args = parse([])
    found["made"] = str(torch.zeros(1, device=args.device).device)  # site: device_argument
    return found
