#!/usr/bin/env bash
# Creates .venv (if missing) with torch, torchvision and dmlpatch (editable, with test tools).
# torch 2.14.1 + torchvision 0.29.1 are the pair that installs together here; dmlpatch itself
# supports torch >= 2.4.1 (torch-directml's pin).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
