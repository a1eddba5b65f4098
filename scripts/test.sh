#!/usr/bin/env bash
# The whole test suite (tests/unit, then tests/e2e), plus the lint and format gates.
# Extra arguments go to pytest: `bash scripts/test.sh tests/unit` runs the fast tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks examples scripts docs/conf.py
.venv/bin/ruff format --check src tests benchmarks examples scripts docs/conf.py
# The type checker (configured in pyproject.toml), before the tests; no comment may silence it.
.venv/bin/mypy
if grep -rn --include="*.py" "type: ignore" src tests benchmarks examples docs; then
  echo "type: ignore comments are not allowed (see above)"
  exit 1
fi
# Two workers: most end-to-end tests wait on a program they started, so two at a time fit the 25
# minutes on 2 cores. Whole files per worker: a file's tests share its workspace and some use
# what an earlier one made (the YOLO runs' best.pt). The slowest tests are printed to keep it so.
.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 "$@"
