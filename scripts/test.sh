#!/usr/bin/env bash
# The whole test suite, plus the lint gate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks examples
# The slowest tests, so that the suite stays within its time (25 minutes on 2 cores).
.venv/bin/python -m pytest -q --durations=15 "$@"
