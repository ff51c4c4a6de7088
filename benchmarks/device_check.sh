#!/usr/bin/env bash
# The prepared check for a lent GPU machine (docs/gpu.md): install, run the GPU tests, time
# the Triton kernels, benchmark the engine on the CPU and on --device cuda (greedy tokens
# compared), and write ONE JSON report, in under 8 minutes (each step has its own
# timeout; their sum is 470 s).
#
#   bash benchmarks/device_check.sh [--dry-run] [--out PATH] [--wheels DIR]
#
# --out: the report (default: $OUT/device_check.json where the device tool sets OUT, else
#   ./device_check.json). --wheels: a wheelhouse carried to a machine with no network;
#   pip then installs from it alone (PIP_NO_INDEX, PIP_FIND_LINKS). --dry-run, or any
#   machine where torch sees no CUDA device: print the plan and exit 0, running nothing.
#
# Install: `bash install.sh` with DRAFTWISE_KEEP_TORCH=1, so a machine's own CUDA build of
# torch and its triton are kept (install.sh's pins are the CPU wheel and triton 3.9.0).
# The engine runs twice: `bench` on the CPU engine (--device cpu, 16 threads), and
# benchmarks/device_engine.py, the same engine on --device cuda (the Triton kernels)
# against --device cpu in float32: greedy tokens compared, tok/s (speculation off,
# n-gram, draft_model).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
DRY=0
REPORT=""
WHEELS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --out) REPORT="$2"; shift ;;
        --wheels) WHEELS="$2"; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "device_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$REPORT" ]; then
    if [ -n "${OUT:-}" ]; then REPORT="$OUT/device_check.json"; else REPORT="$PWD/device_check.json"; fi
fi

WORKLOAD="$ROOT/benchmarks/workloads/cpu-smoke-8.jsonl"
DW="$PY -c 'from draftwise.cli import main; main()'"
BENCH="$DW bench --workload $WORKLOAD --max-tokens 32 --threads 16"
NGRAM='{"method":"ngram","num_speculative_tokens":4}'
# the default model drafting for itself: a timing of the draft loop, not of acceptance
draft_config() {
    "$PY" -c 'import json; from draftwise.formats.default_model import default_model_path as p
print(json.dumps({"method": "draft_model", "model": p(), "num_speculative_tokens": 3}))'
}
export -f draft_config
export PY

# step name | timeout (s) | command
STEPS=(
    "install|140|env DRAFTWISE_KEEP_TORCH=1 bash $ROOT/install.sh"
    "gpu_tests|110|$PY -m pytest -q -p no:cacheprovider $ROOT/tests/core/gpu --junitxml=\$WORK/gpu_tests.xml"
    "kernels|50|$PY $ROOT/benchmarks/gpu_kernels.py --out \$WORK/kernels.json"
    "engine_off|25|$BENCH --out \$WORK/engine_off.json"
    "engine_ngram|30|$BENCH --speculative-config '$NGRAM' --out \$WORK/engine_ngram.json"
    "engine_draft_model|30|$BENCH --speculative-config \"\$(draft_config)\" --out \$WORK/engine_draft_model.json"
    "cuda_engine|85|$PY $ROOT/benchmarks/device_engine.py --out \$WORK/cuda_engine.json"
)

plan() {
    echo "device_check: would write $REPORT after these steps (timeout in seconds):"
    [ -n "$WHEELS" ] && echo "  (pip from the wheelhouse $WHEELS only: PIP_NO_INDEX=1 PIP_FIND_LINKS=$WHEELS)"
    for step in "${STEPS[@]}"; do
        IFS='|' read -r name limit cmd <<<"$step"
        printf '  %-20s %4s  %s\n' "$name" "$limit" "$cmd"
    done
}

if [ "$DRY" = 1 ]; then
    echo "device_check: dry run"
    plan
    exit 0
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "device_check: no CUDA device here (torch sees none); nothing run"
    plan
    exit 0
fi

WORK="$(mktemp -d)"
export WORK PYTHONUNBUFFERED=1
[ -n "$WHEELS" ] && export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS"
: >"$WORK/steps.tsv"
cd "$ROOT" || exit 2
for step in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<<"$step"
    echo "== $name (timeout ${limit}s)"
    start=$(date +%s%N)
    timeout "$limit" bash -c "$cmd" >"$WORK/$name.log" 2>&1
    rc=$?
    end=$(date +%s%N)
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( (end - start) / 1000000 ))" >>"$WORK/steps.tsv"
    tail -n 3 "$WORK/$name.log"
done

mkdir -p "$(dirname "$REPORT")"
"$PY" - "$WORK" "$REPORT" <<'PYEOF'
"""Merge the steps' logs and JSON files into the one report."""
import json, os, subprocess, sys
import xml.etree.ElementTree as ET

work, report_path = sys.argv[1], sys.argv[2]
report = {"steps": {}}
for line in open(os.path.join(work, "steps.tsv")):
    name, rc, millis = line.rstrip("\n").split("\t")
    log = open(os.path.join(work, name + ".log"), errors="replace").read()
    report["steps"][name] = {"rc": int(rc), "seconds": int(millis) / 1000,
                             "timed_out": rc == "124", "log_tail": log[-1500:]}
try:
    suite = ET.parse(os.path.join(work, "gpu_tests.xml")).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    report["gpu_tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
except (OSError, ET.ParseError, IndexError) as exc:
    report["gpu_tests"] = {"error": str(exc)}
for name in ("kernels", "engine_off", "engine_ngram", "engine_draft_model", "cuda_engine"):
    try:
        report[name] = json.load(open(os.path.join(work, name + ".json")))
    except (OSError, ValueError) as exc:
        report[name] = {"error": str(exc)}
try:
    report["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError) as exc:
    report["nvidia_smi"] = str(exc)
with open(report_path, "w") as f:
    json.dump(report, f, indent=1)
print(f"device_check: wrote {report_path}")
PYEOF
