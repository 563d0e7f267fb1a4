#!/usr/bin/env bash
# CI without a GPU: the device check's scripts parse, and the CUDA path builds the way a bare CUDA
# container builds it (scripts/gpu_validate.sh --build-only): dependencies only from the bundle
# of scripts/gpu_bundle.sh, MPI and Qt hidden, cuBLAS and NCCL from a folder laid out as NVIDIA's
# wheels (site-packages/nvidia/cu13, nvidia/nccl; links to this toolkit's libraries), then the CPU
# side of its tests. Skipped where there is no nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
bash -n scripts/gpu_validate.sh
bash -n scripts/gpu_bundle.sh
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
  echo "gpu_container: no nvcc, CUDA build skipped"
  exit 0
fi
CUDA_ROOT=$(cd "$(dirname "$NVCC")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
scripts/gpu_bundle.sh "$work/bundle"
# A wheel-shaped folder: nvidia/cu13/{include,lib} (nvidia-cublas), nvidia/nccl/{include,lib}.
wheels="$work/site-packages/nvidia"
mkdir -p "$wheels/cu13/include" "$wheels/cu13/lib" "$wheels/nccl/include" "$wheels/nccl/lib"
find_lib() { find "$CUDA_ROOT/lib" "$CUDA_ROOT/lib64" "$CUDA_ROOT/targets" /usr/lib /usr/local/lib \
  -name "$1" 2>/dev/null | head -1; }
for lib in 'libcublas.so.1[0-9]' 'libcublasLt.so.1[0-9]'; do
  f=$(find_lib "$lib")
  [ -n "$f" ] && ln -s "$f" "$wheels/cu13/lib/"
done
for h in cublas.h cublasLt.h cublas_api.h cublas_v2.h; do
  f=$(find "$CUDA_ROOT/include" "$CUDA_ROOT/targets" -name "$h" 2>/dev/null | head -1)
  [ -n "$f" ] && ln -s "$f" "$wheels/cu13/include/"
done
f=$(find_lib 'libnccl.so.2') && [ -n "$f" ] && ln -s "$f" "$wheels/nccl/lib/"
f=$(find "$CUDA_ROOT/include" /usr/include /usr/local/include -name nccl.h 2>/dev/null | head -1) &&
  [ -n "$f" ] && ln -s "$f" "$wheels/nccl/include/"
BUNDLE="$work/bundle" NVIDIA_WHEELS="$wheels" OUT="$work/out" JOBS=${JOBS:-2} \
  scripts/gpu_validate.sh --build-only build-gpu-container
grep -q "cuBLAS from wheels: $wheels" "$work/out/gpu_validate.log" || {
  echo "gpu_container: cuBLAS did not come from the wheel folder"; exit 1; }
echo "gpu_container: passed"
