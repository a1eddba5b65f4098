#!/usr/bin/env bash
# What the demo runs, and nothing more: .venv with torch, numpy, ninja (the simulated device's
# build) and dmlpatch (editable). scripts/setup.sh adds the rest: the torch the suite pins, the
# test tools and the target libraries.
# The demo's torch is DMLPATCH_TORCH (default torch==2.13.0, whose CPU build pip takes from this
# machine's wheel directory: about 200 MB, where the suite's torch 2.14.1 is a 5.5 GB CUDA
# build); a torch already in .venv is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=${DMLPATCH_TORCH:-torch==2.13.0}
START=$SECONDS

step() { printf '[set-up %3ds] %s\n' "$((SECONDS - START))" "$*"; }

# pip's own progress, one line per package (its --quiet says nothing for minutes). A new .venv
# is made without pip (ensurepip is a tenth of the set-up) and filled by this Python's pip;
# scripts/setup.sh gives it its own pip.
pip_install() {
  local pip=(.venv/bin/python -m pip)
  if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    if "$PYTHON" -m pip install --help 2>/dev/null | grep -q -- '--python'; then
      pip=("$PYTHON" -m pip --python .venv/bin/python)
    else  # a pip before 22.3 cannot fill another environment: give .venv its own
      .venv/bin/python -m ensurepip --upgrade >/dev/null
    fi
  fi
  "${pip[@]}" install --disable-pip-version-check --progress-bar off "$@" 2>&1 |
    awk '/^(Collecting|Installing collected|Successfully installed)|ERROR|[Ee]rror:/ {
           print "           " $0; fflush() }'
}

if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  "$PYTHON" -m venv --without-pip .venv
fi
if ! .venv/bin/python -c "import torch, numpy, ninja, hatchling, editables" >/dev/null 2>&1; then
  step "installing $TORCH, numpy and the build tools (the longest step)"
  # Byte-compiling all of torch at install time costs more than the demo's imports of it; the
  # suite's torch (DMLPATCH_TORCH, from scripts/setup.sh) is compiled: tests start hundreds of
  # processes that must not compile torch each time.
  compile=--no-compile
  [ -n "${DMLPATCH_TORCH:-}" ] && compile=--compile
  # shellcheck disable=SC2086  # DMLPATCH_TORCH may name several requirements
  pip_install "$compile" $TORCH numpy ninja hatchling editables
fi
if ! .venv/bin/python -c "import dmlpatch" >/dev/null 2>&1; then
  step "installing dmlpatch (editable)"
  # Its requirements (torch, packaging, filelock) came with the step above.
  pip_install --no-build-isolation --no-deps -e .
fi
ready=$(.venv/bin/python -c 'import dmlpatch, ninja, torch; print("torch", torch.__version__)') ||
  { step "set-up failed (see above)"; exit 1; }
step "ready: $ready"
