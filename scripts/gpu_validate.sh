#!/usr/bin/env bash
# One command for a GPU machine: builds the CUDA path (Release, Ninja), runs the CUDA ops against
# the CPU oracle, and `distplan validate --device cuda` on the scenarios in data/validation/
# (single GPU with --emulate-rank on large layouts; all GPUs where the layout fits the machine),
# times one GPT layer stack forward + backward on device-resident data against the GPU's dense
# bf16 peak (distplan-cuda-layer-bench; LAYER_HIDDEN, LAYER_HEADS, LAYER_SEQ, LAYER_LAYERS override
# the hidden 4096 / 32 heads / seq 1024 / 2 layers shape), then writes one results JSON to $OUT
# (or ./out). Budget: under 8 minutes on one H100/H200.
#   scripts/gpu_validate.sh [build-dir]
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
OUT_DIR="${OUT:-$ROOT/out}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_validate.log"
: > "$LOG"
START=$(date +%s)
say() { echo "[gpu_validate $(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }

# Open MPI as root on one node (TOOLCHAIN.md).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

say "configure + build (Release, Ninja, sm_80;sm_90) in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDISTPLAN_BUILD_GUI=OFF \
  -DDISTPLAN_ENABLE_CUDA=ON >> "$LOG" 2>&1 || { say "configure failed"; exit 1; }
JOBS=$(nproc 2>/dev/null || echo 4)
cmake --build "$BUILD" -j "$JOBS" --target distplan gpu_backend_cuda_ops_test gpu_backend_training_test gpu_backend_bench \
  distplan-cuda-layer-bench \
  >> "$LOG" 2>&1 || { say "build failed"; exit 1; }

GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
say "GPUs visible: $GPUS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$LOG" 2>&1

say "CUDA ops against the CPU oracle"
"$BUILD/tests/gpu_backend/gpu_backend_cuda_ops_test" --gtest_output="json:$OUT_DIR/cuda_ops.json" \
  >> "$LOG" 2>&1
OPS_RC=$?
say "CUDA trainer against the CPU trainer"
"$BUILD/tests/gpu_backend/gpu_backend_training_test" --gtest_filter='CudaTrainer.*' \
  --gtest_output="json:$OUT_DIR/cuda_trainer.json" >> "$LOG" 2>&1
TRAINER_RC=$?

say "layer stack forward+backward on the GPU (limit 150 s)"
timeout 150 "$BUILD/gpu_backend/distplan-cuda-layer-bench" --hidden "${LAYER_HIDDEN:-4096}" \
  --heads "${LAYER_HEADS:-32}" --seq "${LAYER_SEQ:-1024}" --batch 1 --layers "${LAYER_LAYERS:-2}" \
  --reps 2 > "$OUT_DIR/layer_stack.json" 2>> "$LOG"
LAYER_RC=$?
say "  exit $LAYER_RC"
LAYER_JSON=null
if [ "$LAYER_RC" -eq 0 ] && [ -s "$OUT_DIR/layer_stack.json" ]; then
  LAYER_JSON=$(cat "$OUT_DIR/layer_stack.json")
  grep -E '"(tflops|fraction_of_peak)"' "$OUT_DIR/layer_stack.json" | tee -a "$LOG"
fi

# scenario file | extra validate arguments | time limit (s)
RUNS=(
  "llama2-7b-1gpu-2layers.json||120"
  "llama2-70b-tp8-pp4-dp2-stage0.json|--emulate-rank 0|180"
)
if [ "$GPUS" -ge 4 ]; then RUNS+=("gpt-small-tp2-pp2.json||120"); fi
if [ "$GPUS" -lt 4 ]; then RUNS+=("gpt-small-tp2-pp2.json|--emulate-rank 0|60"); fi

RESULTS=()
for run in "${RUNS[@]}"; do
  IFS='|' read -r file args limit <<< "$run"
  name="${file%.json}${args:+_$(echo "$args" | tr -d ' -')}"
  say "validate --device cuda $file $args (limit ${limit} s)"
  timeout "$limit" "$BUILD/cli/distplan" validate "$ROOT/data/validation/$file" --device cuda \
    --steps "${STEPS:-1}" --timeout "$limit" $args > "$OUT_DIR/$name.json" 2>> "$LOG"
  rc=$?
  say "  exit $rc"
  RESULTS+=("{\"scenario\": \"$file\", \"args\": \"$args\", \"exit_code\": $rc, \"result\": \"$name.json\"}")
done

say "benchmark (CPU ops and one CPU training step)"
timeout 90 "$BUILD/bench/gpu_backend_bench" --benchmark_format=json \
  --benchmark_out="$OUT_DIR/bench.json" --benchmark_min_time=0.2 >> "$LOG" 2>&1

{
  echo "{"
  echo "  \"schema\": \"distplan.gpu_validate/v1\","
  echo "  \"gpus\": $GPUS,"
  echo "  \"cuda_ops_exit_code\": $OPS_RC,"
  echo "  \"cuda_trainer_exit_code\": $TRAINER_RC,"
  echo "  \"layer_stack_exit_code\": $LAYER_RC,"
  echo "  \"layer_stack\": $LAYER_JSON,"
  echo "  \"seconds\": $(($(date +%s) - START)),"
  echo "  \"runs\": ["
  for i in "${!RESULTS[@]}"; do
    sep=","; [ "$i" -eq $((${#RESULTS[@]} - 1)) ] && sep=""
    echo "    ${RESULTS[$i]}$sep"
  done
  echo "  ]"
  echo "}"
} > "$OUT_DIR/gpu_validate.json"
say "results in $OUT_DIR/gpu_validate.json"
