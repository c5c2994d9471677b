#!/usr/bin/env bash
# Download, with network, the wheels a GPU machine's image lacks (for Python 3.12, x86_64) into
# .gpu_wheels/ (git-ignored); carry that folder with the run (device tool: carry [".gpu_wheels"]).
# The image has torch, triton, numpy, transformers, httpx, jinja2, rich, tokenizers: never replaced
# (gpu_model_check.sh installs with --no-deps and skips numpy/torch/triton). pytest: the CUDA tests
# of tests/test_device.py run there. ~23 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu_wheels && mkdir -p .gpu_wheels
python3 -m pip download -q -d .gpu_wheels --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 \
    gguf starlette uvicorn uvloop watchdog "llguidance>=1.9" prometheus_client pytest
ls .gpu_wheels && du -sh .gpu_wheels
