#!/usr/bin/env bash
# Builds the libraries, the CLI and the unit tests with AddressSanitizer + UndefinedBehaviorSanitizer
# (clang; the `asan` preset: no CUDA, no GUI, no benchmarks) in build-asan/, and runs ctest under
# it. Any sanitizer report fails the test that triggered it, and so the run. See docs/trust.md.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
build=build-asan

cmake --preset asan >/dev/null
cmake --build "$build" -j"$jobs"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/.ci/lsan.supp:print_suppressions=0"
# Tests that start MPI ranks (mpirun, directly or through `distplan validate`): Open MPI's plugins
# are dlopen'd and unloaded, so the allocations they keep until exit show up as leaks in an
# "<unknown module>" that no suppression can name. They run with address and UB checks on and leak
# detection off; every other test runs with leak detection. They are the tests of the binaries
# labelled `mpi` (tests/gpu_backend/CMakeLists.txt) and the CLI tests named here.
cli_mpi_tests='Guidance.ValidateTable|ValidateResources'
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 300 -LE mpi -E "$cli_mpi_tests"
no_leaks="$ASAN_OPTIONS:detect_leaks=0"
ASAN_OPTIONS="$no_leaks" ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 300 -L mpi
ASAN_OPTIONS="$no_leaks" ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 300 \
  -R "$cli_mpi_tests"
echo "sanitize: no findings"
