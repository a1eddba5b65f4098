#!/usr/bin/env bash
# The demo: an unmodified CUDA-style training script runs on the simulated DirectML device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m dmlpatch --device sim --report examples/train_cnn.py --epochs 1
