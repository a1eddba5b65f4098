#!/usr/bin/env bash
# The whole test suite, plus the lint gate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/python -m pytest -q "$@"
