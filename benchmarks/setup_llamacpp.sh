#!/usr/bin/env bash
# Build llama.cpp's own binaries (llama-server, llama-bench) for benchmarks/compare_llamacpp.py.
# The source is the llama.cpp tree vendored in the llama-cpp-python==0.3.36 sdist (build
# 0c1e570), fetched through pip; only the C++ binaries are built, never the Python binding
# (2-3x slower than the binaries: see shared/reference/peers-cpu.md). llama.cpp is never a
# draftwise dependency: everything lands under DIR.
#
# Usage: benchmarks/setup_llamacpp.sh [DIR]      (default DIR: /tmp/peers)
#   -> DIR/llama.cpp-build/bin/llama-server, DIR/llama.cpp-build/bin/llama-bench
# About 10 minutes on 2 cores; JOBS=N sets the build parallelism (default: all cores).
# PATCHES="a.patch b.patch" applies patches to the source first (each once; -p1 from the
# llama.cpp root): benchmarks/llamacpp_final_tap.patch lets llama.cpp's draft-dflash run
# a drafter that taps the target's last layer (benchmarks/llamacpp_dflash.py).
set -euo pipefail

DIR="$(mkdir -p "${1:-/tmp/peers}" && cd "${1:-/tmp/peers}" && pwd)"
VERSION=0.3.36
SRC="$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$DIR/llama.cpp-build"
JOBS="${JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"

if [ ! -f "$DIR/src/llama_cpp_python-$VERSION.tar.gz" ]; then
    "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DIR/src"
fi
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    tar xzf "$DIR/src/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/src"
fi
for p in ${PATCHES:-}; do
    p="$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"
    if patch -p1 -R --dry-run -s -f -d "$SRC" < "$p" > /dev/null 2>&1; then
        echo "already applied: $p"
    else
        patch -p1 -s -d "$SRC" < "$p"
        echo "applied: $p"
    fi
done
cmake -S "$SRC" -B "$BUILD" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$JOBS" --target llama-server llama-bench
"$BUILD/bin/llama-server" --version
echo "llama.cpp binaries ready: $BUILD/bin/llama-server $BUILD/bin/llama-bench"
