#!/usr/bin/env bash
# Packs what the CUDA path needs and a bare CUDA container lacks into one git-ignored folder that
# travels with the source tree: the header-only dependencies (Eigen, nlohmann/json, CLI11, fmt used
# header-only) and GoogleTest's sources, each with its licence. Run it on the build machine (where
# ./build.sh installed the Debian packages); CMake takes the folder with
# -DDISTPLAN_BUNDLE_DIR=<folder> instead of find_package (cmake/Bundle.cmake, docs/gpu_backend.md).
#   scripts/gpu_bundle.sh [folder]          (default: bundle/ at the repository root)
# Sources can be overridden: EIGEN_INCLUDE (the folder holding Eigen/), JSON_INCLUDE (holding
# nlohmann/), CLI11_INCLUDE (holding CLI/), FMT_INCLUDE (holding fmt/), GTEST_SRC (googletest's
# source tree, holding googletest/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/bundle}"
LIMIT_MIB=20

EIGEN_INCLUDE=${EIGEN_INCLUDE:-/usr/include/eigen3}
JSON_INCLUDE=${JSON_INCLUDE:-/usr/include}
CLI11_INCLUDE=${CLI11_INCLUDE:-/usr/include}
FMT_INCLUDE=${FMT_INCLUDE:-/usr/include}
GTEST_SRC=${GTEST_SRC:-/usr/src/googletest}

need() { [ -e "$1" ] || { echo "gpu_bundle: $1 not found ($2)" >&2; exit 2; }; }
need "$EIGEN_INCLUDE/Eigen/Dense" "Eigen 3.4: libeigen3-dev or EIGEN_INCLUDE"
need "$JSON_INCLUDE/nlohmann/json.hpp" "nlohmann/json 3.11: nlohmann-json3-dev or JSON_INCLUDE"
need "$CLI11_INCLUDE/CLI/CLI.hpp" "CLI11: libcli11-dev or CLI11_INCLUDE"
need "$FMT_INCLUDE/fmt/format-inl.h" "fmt's full headers (header-only mode): libfmt-dev or FMT_INCLUDE"
need "$GTEST_SRC/googletest/src/gtest-all.cc" "GoogleTest sources: libgtest-dev or GTEST_SRC"

rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp/include" "$DEST.tmp/googletest" "$DEST.tmp/licenses"
# Headers: Eigen without unsupported/ (not used), the others whole.
cp -r "$EIGEN_INCLUDE/Eigen" "$DEST.tmp/include/"
cp -r "$JSON_INCLUDE/nlohmann" "$CLI11_INCLUDE/CLI" "$FMT_INCLUDE/fmt" "$DEST.tmp/include/"
# GoogleTest: the top-level CMake project and googletest/ (no googlemock, docs, samples, tests).
cp "$GTEST_SRC/CMakeLists.txt" "$DEST.tmp/googletest/"
mkdir -p "$DEST.tmp/googletest/googletest"
for part in CMakeLists.txt cmake include src; do
  cp -r "$GTEST_SRC/googletest/$part" "$DEST.tmp/googletest/googletest/"
done
[ -f "$GTEST_SRC/LICENSE" ] && cp "$GTEST_SRC/LICENSE" "$DEST.tmp/licenses/googletest.LICENSE"
# Licences and versions: Debian's copyright files when the sources are Debian's.
for pkg in libeigen3-dev nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev; do
  [ -f "/usr/share/doc/$pkg/copyright" ] && cp "/usr/share/doc/$pkg/copyright" "$DEST.tmp/licenses/$pkg.copyright"
done
{
  echo "# distplan dependency bundle (scripts/gpu_bundle.sh), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for pkg in libeigen3-dev nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev; do
    v=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
    echo "$pkg ${v:-unknown (not from a Debian package)}"
  done
} > "$DEST.tmp/VERSIONS.txt"

size_kib=$(du -sk "$DEST.tmp" | cut -f1)
if [ "$size_kib" -ge $((LIMIT_MIB * 1024)) ]; then
  echo "gpu_bundle: $((size_kib / 1024)) MiB, over the ${LIMIT_MIB} MiB limit" >&2
  rm -rf "$DEST.tmp"
  exit 1
fi
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "gpu_bundle: $DEST, $((size_kib / 1024)) MiB ($size_kib KiB)"
