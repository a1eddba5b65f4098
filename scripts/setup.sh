#!/usr/bin/env bash
# Creates .venv (if missing) with what the test suite runs: the demo's set-up, then torch and
# torchvision at the suite's pin, the test tools and the target libraries.
# torch 2.14.1 + torchvision 0.29.1 are the pair that installs together here; dmlpatch itself
# supports torch >= 2.4.1 (torch-directml's pin).
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh .venv gets the suite's torch at once (not the demo's, then this one).
DMLPATCH_TORCH="torch==2.14.1 torchvision==0.29.1" bash scripts/setup-demo.sh
# The demo's .venv has no pip of its own.
.venv/bin/python -m pip --version >/dev/null 2>&1 || .venv/bin/python -m ensurepip --upgrade >/dev/null
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c scripts/torch-pin.txt \
  -e ".[test,docs]"
# Debian's Chromium and ChromeDriver: the placement page is tested in a real headless browser
# (tests/e2e/test_placement_page.py).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  apt=(apt-get)
  if [ "$(id -u)" != 0 ]; then apt=(sudo -n apt-get); fi
  export DEBIAN_FRONTEND=noninteractive
  "${apt[@]}" install -y -q chromium chromium-driver >/dev/null 2>&1 || {
    "${apt[@]}" update -q >/dev/null && "${apt[@]}" install -y -q chromium chromium-driver >/dev/null
  } || echo "setup: could not install chromium and chromium-driver (apt-get as root or sudo):" \
    "the placement page's browser test will fail" >&2
fi
# The target libraries the end-to-end tests run for real. basicsr is an sdist whose build needs
# torch: without build isolation pip uses the torch above instead of fetching a second one.
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  setuptools wheel cython numpy
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  basicsr==1.4.2 facexlib==0.3.0 gfpgan==1.3.8 realesrgan==0.3.0 ultralytics==8.4.190
# ultralytics 8.4 pickles its trainer for DDP ranks with cloudpickle (an optional dependency).
.venv/bin/python -m pip install --quiet --disable-pip-version-check cloudpickle==3.1.2
# The libraries DirectML users run most, for the known-failure tests (whisper's sparse buffer,
# transformers' attention masks, diffusers' group norms). The constraint keeps the torch above.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c scripts/torch-pin.txt \
  openai-whisper==20250625 transformers==4.57.6 diffusers==0.35.2 accelerate==1.11.0 \
  sentence-transformers==5.1.2
# Complex numbers and FFTs on the device: Demucs (Ultimate Vocal Remover's models; 4.1 needs no
# torchaudio) and auraloss (the STFT losses vocoders train with).
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c scripts/torch-pin.txt \
  demucs==4.1.0 auraloss==0.4.0
# timm's models in the operator coverage corpus (tests/e2e/test_operator_coverage.py).
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c scripts/torch-pin.txt \
  timm==1.0.31
# PyTorch Lightning and Fabric (tests/e2e/libraries/test_lightning.py), torch kept too.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c scripts/torch-pin.txt \
  pytorch-lightning==2.6.6
# Objects with their own .cuda()/.to() (tests/e2e/libraries/test_own_to.py), torch kept too.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c scripts/torch-pin.txt \
  spandrel==0.4.2 torchmetrics==1.9.0
# The newest transformers 5 beside the venv (tests/e2e/libraries/test_hf_stack.py), with the
# huggingface-hub, tokenizers and HTTP client it needs that the venv's 4.57 does not; the
# venv's torch, accelerate and the rest serve both (no dependency resolution: none replaced).
if [ ! -d .cache/transformers-5.24.0/transformers ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .cache/transformers-5.24.0 transformers==5.24.0 huggingface-hub==2.4.0 \
    tokenizers==0.23.3 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
fi
# Import hooks that rewrite code (tests/e2e/test_test_suites.py) beside the venv: their pytest
# plugins would otherwise load in every session of this suite.
if [ ! -d .cache/import-hooks/typeguard ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .cache/import-hooks typeguard==4.6.1 jaxtyping==0.3.11 wadler-lindig==0.1.8
fi
# The early-2024 ultralytics line for the version-gate tests, beside the venv.
if [ ! -d .cache/ultralytics-8.1.47/ultralytics ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .cache/ultralytics-8.1.47 \
    ultralytics==8.1.47 pandas==2.2.3 seaborn==0.13.2 pytz tzdata py-cpuinfo==9.0.0
fi
# yolov5 7.0.14 (the pip form of ultralytics' YOLOv5 repository) beside the venv: it pins
# huggingface-hub<0.25, which transformers cannot use, so it and what it imports at start-up
# (pkg_resources from setuptools<81, roboflow in train.py) go into a directory of their own.
if [ ! -d .cache/yolov5-7.0.14/yolov5 ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .cache/yolov5-7.0.14 \
    yolov5==7.0.14 pandas==3.1.1 seaborn==0.13.2 setuptools==80.10.2 huggingface-hub==0.24.7 \
    roboflow==1.7.3 requests-toolbelt==1.0.0 python-dotenv==1.2.4 pillow-avif-plugin==1.6.0
fi
# The lightning package beside the venv, for its `fabric` console script and the click its CLI
# needs (tests/e2e/libraries/test_lightning.py); the venv's pytorch-lightning serves the rest.
if [ ! -d .cache/lightning-2.6.6/lightning ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .cache/lightning-2.6.6 lightning==2.6.6 click==8.3.1
fi
# torch_geometric (pure Python: it writes its layers' propagate into temporary modules) beside
# the venv (tests/e2e/libraries/test_torch_geometric.py); jinja2, tqdm and psutil are the venv's.
if [ ! -d .cache/torch_geometric-2.6.1/torch_geometric ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .cache/torch_geometric-2.6.1 torch_geometric==2.6.1
fi
# facexlib 0.2.5 (module-level device choice, early 2024) for its version-gated rules.
if [ ! -d .cache/facexlib-0.2.5/facexlib ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .cache/facexlib-0.2.5 facexlib==0.2.5
fi
