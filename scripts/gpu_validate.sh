#!/usr/bin/env bash
# The device check, one command for a GPU machine (docs/gpu_backend.md "GPU script"):
#   1. configures and builds the CUDA path the way a bare CUDA container can (nvcc, CMake, Ninja,
#      Python with NVIDIA's wheels): dependencies from the bundle of scripts/gpu_bundle.sh when
#      bundle/ exists, MPI and Qt hidden (emulated ranks), cuBLAS/NCCL from the toolkit or the wheels;
#   2. runs the CUDA ops against the CPU oracle and the CUDA trainer against the CPU trainer;
#   3. times one GPT layer stack forward + backward with CUDA events against the GPU's dense bf16
#      peak, causal attention FLOPs counted (LAYER_HIDDEN, LAYER_HEADS, LAYER_SEQ, LAYER_LAYERS
#      override hidden 4096 / 32 heads / seq 1024 / 2 layers);
#   4. runs `distplan validate --device cuda` on every scenario of data/validation/ (one rank in
#      process; larger layouts as their rank 0 through --emulate-rank);
#   5. writes every figure into $OUT/gpu_validate.json (default OUT: <build>-out, beside the build).
# Budget: under 8 minutes on one H100/H200 (each step has a time limit; steps past BUDGET_S,
# default 450 s, are skipped and say so).
#   scripts/gpu_validate.sh [--build-only] [build-dir]
# --build-only: steps 1 and the CPU tests of the build (CI, no GPU needed).
set -uo pipefail

BUILD_ONLY=0
if [ "${1:-}" = "--build-only" ]; then BUILD_ONLY=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
OUT_DIR="${OUT:-${BUILD%/}-out}"
BUNDLE="${BUNDLE:-$ROOT/bundle}"
BUDGET_S=${BUDGET_S:-450}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_validate.log"
: > "$LOG"
START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
say() { echo "[gpu_validate $(elapsed) s] $*" | tee -a "$LOG"; }
# Seconds left in the budget, at least 1.
left() { local l=$((BUDGET_S - $(elapsed))); [ "$l" -lt 1 ] && l=1; echo "$l"; }
# min(limit, time left)
limit() { local l; l=$(left); [ "$1" -lt "$l" ] && l=$1; echo "$l"; }
STEPS_JSON="$OUT_DIR/steps.jsonl"
: > "$STEPS_JSON"
# record NAME EXIT_CODE SECONDS [RESULT_FILE]: one line per step for the summary.
record() {
  printf '{"name": "%s", "exit_code": %s, "seconds": %s, "result": "%s"}\n' "$1" "$2" "$3" "${4:-}" \
    >> "$STEPS_JSON"
}

CONFIG=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DDISTPLAN_ENABLE_CUDA=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_Qt6=ON
  -DDISTPLAN_BUILD_PYTHON=OFF -DDISTPLAN_BUILD_BENCH=OFF -DDISTPLAN_SKIP_MODULES=gui\;search)
if [ -f "$BUNDLE/include/nlohmann/json.hpp" ]; then
  CONFIG+=(-DDISTPLAN_BUNDLE_DIR="$BUNDLE")
  say "dependencies from the bundle $BUNDLE"
else
  say "no bundle at $BUNDLE (scripts/gpu_bundle.sh): dependencies from the system"
fi
[ -n "${NVIDIA_WHEELS:-}" ] && CONFIG+=(-DDISTPLAN_NVIDIA_WHEELS="$NVIDIA_WHEELS")
TARGETS=(distplan gpu_backend_ops_test gpu_backend_cuda_ops_test gpu_backend_training_test
  distplan-cuda-layer-bench)

say "configure + build (Release, Ninja, sm_80;sm_90, no MPI, no Qt) in $BUILD"
t0=$(date +%s)
cmake -S "$ROOT" -B "$BUILD" "${CONFIG[@]}" ${CMAKE_ARGS:-} >> "$LOG" 2>&1 || {
  say "configure failed (see $LOG)"; tail -30 "$LOG"; exit 1; }
grep -E "distplan: (cuBLAS|CUDA|dependencies)" "$LOG" | sed 's/^/  /'
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >> "$LOG" 2>&1 || {
  say "build failed (see $LOG)"; tail -40 "$LOG"; exit 1; }
record build 0 $(($(date +%s) - t0))
say "built in $(($(date +%s) - t0)) s"

# The bundle must be the only source of the header-only dependencies, and nothing of MPI or Qt
# may be compiled in: every header the objects used (Ninja's dependency log) is checked.
if [ -f "$BUNDLE/include/nlohmann/json.hpp" ]; then
  bad=$(ninja -C "$BUILD" -t deps 2>/dev/null |
    grep -E '^ +/usr/(local/)?include/(eigen3|nlohmann|CLI|fmt|gtest|gmock)/|mpi\.h$|/openmpi/|/qt6/|/Qt[A-Za-z]+/' |
    sort -u | head -5)
  if [ -n "$bad" ]; then
    say "headers from outside the bundle: $bad"
    exit 1
  fi
  say "every dependency header came from the bundle; no MPI or Qt header"
fi

if [ "$BUILD_ONLY" -eq 1 ]; then
  say "CPU tests of this configuration (oracle, dispatch, FLOP count; GPU tests skip)"
  "$BUILD/tests/gpu_backend/gpu_backend_ops_test" >> "$LOG" 2>&1 || { say "ops test failed"; exit 1; }
  "$BUILD/tests/gpu_backend/gpu_backend_cuda_ops_test" >> "$LOG" 2>&1 || {
    say "cuda ops test failed"; exit 1; }
  "$BUILD/tests/gpu_backend/gpu_backend_training_test" --gtest_filter='CudaTrainer.*' \
    >> "$LOG" 2>&1 || { say "trainer test failed"; exit 1; }
  say "build-only check passed"
  exit 0
fi

GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
say "GPUs visible: $GPUS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$LOG" 2>&1

# run_step NAME LIMIT_S RESULT_FILE COMMAND...: runs under `timeout`, skipped past the budget.
run_step() {
  local name=$1 lim=$2 result=$3
  shift 3
  if [ "$(elapsed)" -ge "$BUDGET_S" ]; then
    say "$name: skipped (budget of $BUDGET_S s spent)"
    record "$name" '"skipped"' 0 ""
    return
  fi
  lim=$(limit "$lim")
  say "$name (limit $lim s)"
  local t=$(date +%s)
  timeout "$lim" "$@" > "$OUT_DIR/$result" 2>> "$LOG"
  local rc=$?
  record "$name" "$rc" $(($(date +%s) - t)) "$result"
  say "  exit $rc"
}

run_step cuda_ops 90 cuda_ops.txt "$BUILD/tests/gpu_backend/gpu_backend_cuda_ops_test" \
  --gtest_output="json:$OUT_DIR/cuda_ops.json"
run_step cuda_trainer 120 cuda_trainer.txt "$BUILD/tests/gpu_backend/gpu_backend_training_test" \
  --gtest_filter='CudaTrainer.*' --gtest_output="json:$OUT_DIR/cuda_trainer.json"
run_step layer_stack 120 layer_stack.json "$BUILD/gpu_backend/distplan-cuda-layer-bench" \
  --hidden "${LAYER_HIDDEN:-4096}" --heads "${LAYER_HEADS:-32}" --seq "${LAYER_SEQ:-1024}" \
  --batch 1 --layers "${LAYER_LAYERS:-2}" --reps 3

# Every scenario of data/validation/: in process when it has one rank, else its rank 0 emulated.
for file in "$ROOT"/data/validation/*.json; do
  base=$(basename "$file" .json)
  case "$base" in *.result) continue ;; esac
  ranks=$(python3 -c "import json,sys; p=json.load(open(sys.argv[1])).get('parallel',{}); print(p.get('tp',1)*p.get('pp',1)*p.get('dp',1))" "$file" 2>/dev/null || echo 1)
  args=()
  [ "$ranks" -gt 1 ] && args=(--emulate-rank 0)
  run_step "validate_$base" 150 "validate_$base.json" "$BUILD/cli/distplan" validate "$file" \
    --device cuda --steps "${STEPS:-2}" --timeout "$(limit 150)" "${args[@]}"
done

# One document with every figure: the steps, the op errors, the layer stack, the validations.
python3 - "$OUT_DIR" "$GPUS" "$(elapsed)" <<'PY' || say "summary failed"
import json, os, sys
out, gpus, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def gtest(doc):
    if doc is None: return None
    tests = []
    for suite in doc.get("testsuites", []):
        for t in suite.get("testsuite", []):
            item = {"name": f'{suite["name"]}.{t["name"]}', "result": t.get("result"),
                    "status": "failed" if t.get("failures") else
                              ("skipped" if t.get("result") == "SKIPPED" else "passed"),
                    "time": t.get("time")}
            props = {k: float(v) for k, v in t.items() if k.startswith("normalised_error_")}
            if props: item["normalised_errors"] = props; item["max_normalised_error"] = max(props.values())
            if t.get("failures"): item["failures"] = [f.get("failure", "")[:2000] for f in t["failures"]]
            tests.append(item)
    return {"tests": doc.get("tests"), "failures": doc.get("failures"), "cases": tests}
steps = [json.loads(l) for l in open(os.path.join(out, "steps.jsonl")) if l.strip()]
validations = {}
for s in steps:
    if s["name"].startswith("validate_"):
        validations[s["name"][len("validate_"):]] = {"exit_code": s["exit_code"], "seconds": s["seconds"],
                                                      "document": load(s["result"])}
doc = {"schema": "distplan.gpu_validate/v2", "gpus": gpus, "seconds": seconds, "steps": steps,
       "cuda_ops": gtest(load("cuda_ops.json")), "cuda_trainer": gtest(load("cuda_trainer.json")),
       "layer_stack": load("layer_stack.json"), "validate": validations}
with open(os.path.join(out, "gpu_validate.json"), "w") as f:
    json.dump(doc, f, indent=2)
ls = doc["layer_stack"] or {}
print("layer stack:", (ls.get("stack") or {}).get("tflops"), "TFLOP/s,",
      (ls.get("stack") or {}).get("fraction_of_peak"), "of peak")
PY
say "results in $OUT_DIR/gpu_validate.json ($(elapsed) s)"
