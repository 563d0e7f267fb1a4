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
# The same compiler the build picks (CMakeLists.txt: CUDACXX, else /usr/local/cuda/bin/nvcc).
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then
  echo "gpu_container: no nvcc, CUDA build skipped"
  exit 0
fi
# nvcc names its own toolkit root (TOP); the folder above nvcc is not it when nvcc on PATH is a
# wrapper script (/usr/local/bin/nvcc on a minimal PATH).
CUDA_ROOT=$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
[ -n "$CUDA_ROOT" ] || CUDA_ROOT=$(dirname "$NVCC")/..
CUDA_ROOT=$(cd "$CUDA_ROOT" && pwd -P)
echo "gpu_container: toolkit $CUDA_ROOT (nvcc $NVCC)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
scripts/gpu_bundle.sh "$work/bundle"
# A wheel-shaped folder: nvidia/cu13/{include,lib} (nvidia-cublas), nvidia/nccl/{include,lib}.
wheels="$work/site-packages/nvidia"
mkdir -p "$wheels/cu13/include" "$wheels/cu13/lib" "$wheels/nccl/include" "$wheels/nccl/lib"
# first_file NAME DIR...: the first file called NAME under the folders (symlinked folders
# followed), or nothing; -quit so no pipe can break under pipefail.
first_file() {
  local name=$1; shift
  local dirs=() d
  for d in "$@"; do [ -d "$d" ] && dirs+=("$d"); done
  [ ${#dirs[@]} -gt 0 ] || return 0
  find -L "${dirs[@]}" -name "$name" -print -quit 2>/dev/null || true
}
libdirs=("$CUDA_ROOT/lib" "$CUDA_ROOT/lib64" "$CUDA_ROOT/targets" /usr/lib /usr/local/lib)
link_first() { # link_first DEST NAME DIR...
  local dest=$1 f; shift
  f=$(first_file "$@")
  if [ -n "$f" ]; then ln -sf "$f" "$dest/"; fi
}
for lib in 'libcublas.so.1[0-9]' 'libcublasLt.so.1[0-9]'; do
  link_first "$wheels/cu13/lib" "$lib" "${libdirs[@]}"
done
for h in cublas.h cublasLt.h cublas_api.h cublas_v2.h; do
  link_first "$wheels/cu13/include" "$h" "$CUDA_ROOT/include" "$CUDA_ROOT/targets"
done
link_first "$wheels/nccl/lib" 'libnccl.so.2' "${libdirs[@]}"
link_first "$wheels/nccl/include" nccl.h "$CUDA_ROOT/include" /usr/include /usr/local/include
for need in cu13/lib/libcublas.so.1* cu13/include/cublas_v2.h nccl/lib/libnccl.so.2 nccl/include/nccl.h; do
  compgen -G "$wheels/$need" >/dev/null || {
    echo "gpu_container: $need not found under $CUDA_ROOT (or /usr/lib, /usr/local/lib)"; exit 1; }
done
BUNDLE="$work/bundle" NVIDIA_WHEELS="$wheels" OUT="$work/out" JOBS=${JOBS:-2} \
  scripts/gpu_validate.sh --build-only build-gpu-container
grep -q "cuBLAS from wheels: $wheels" "$work/out/gpu_validate.log" || {
  echo "gpu_container: cuBLAS did not come from the wheel folder"; exit 1; }
echo "gpu_container: passed"
