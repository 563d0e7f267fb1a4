#!/usr/bin/env bash
# distplan developer entry point.
#   ./build.sh run    install what is missing (Debian), build, and plan the embedded default
#                     scenario (Llama-2-70B on 64 x H100-80GB), printing the human table
#   ./build.sh test   install what is missing, build everything, run every test (CTest)
#   ./build.sh build  install what is missing and build
# Environment: BUILD_DIR (default: build), JOBS (default: nproc), DISTPLAN_CMAKE_ARGS (extra).
set -euo pipefail
cd "$(dirname "$0")"

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

# Debian 12 packages (TOOLCHAIN: compilers, libraries, Qt6 + Charts + Svg, MPI, fonts for
# offscreen Qt, clang and its runtime for the fuzzer and sanitizers).
PACKAGES=(cmake ninja-build g++ clang libclang-rt-14-dev
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev qt6-svg-dev libxkbcommon-dev
  libeigen3-dev nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin xvfb xauth fonts-dejavu-core
  python3-dev pybind11-dev python3-pytest)
# The Python module (python/) is built for Debian's python3, the interpreter python3-dev and
# python3-pytest belong to, even when another python3 (pyenv, conda) comes first on PATH; CTest
# runs its pytest suite with it. `pip install .` (docs/python.md) builds it for any Python.
PYTHON_ARGS=()
[ -x /usr/bin/python3 ] && PYTHON_ARGS=(-DPython_EXECUTABLE=/usr/bin/python3)

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "build.sh: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

configure_and_build() {
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${PYTHON_ARGS[@]}" \
    ${DISTPLAN_CMAKE_ARGS:-}
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

# Open MPI refuses to run as root and needs a shared-memory transport on one machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# Qt renders offscreen with real fonts: GUI tests need no display.
export QT_QPA_PLATFORM=${QT_QPA_PLATFORM:-offscreen}

case "${1:-run}" in
  run)
    install_deps
    configure_and_build
    "$BUILD_DIR/cli/distplan" plan --format table
    ;;
  test)
    install_deps
    configure_and_build
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 600
    ;;
  build)
    install_deps
    configure_and_build
    ;;
  *)
    echo "usage: ./build.sh [run|test|build]" >&2
    exit 2
    ;;
esac
