#!/usr/bin/env bash
# The whole test suite (tests/unit, then tests/e2e), plus the lint and format gates.
# Extra arguments go to pytest: `bash scripts/test.sh tests/unit` runs the fast tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/ruff format --check src tests benchmarks examples
# No type checker runs here, so no comment may silence one.
if grep -rn --include='*.py' "type: ignore" src tests benchmarks examples; then
  echo "type: ignore comments are not allowed (see above)"
  exit 1
fi
# The slowest tests, so that the suite stays within its time (25 minutes on 2 cores).
.venv/bin/python -m pytest -q --durations=15 "$@"
