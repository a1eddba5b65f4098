#!/usr/bin/env bash
# The demo: an unmodified CUDA-style training script on the CPU and on the simulated DirectML
# device, side by side. Sets up only what it runs (scripts/setup-demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-demo.sh
.venv/bin/python examples/demo.py
