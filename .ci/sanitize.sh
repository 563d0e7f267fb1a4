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
# Open MPI and its plugins keep allocations alive until exit by design; only those are suppressed.
export LSAN_OPTIONS="suppressions=$PWD/.ci/lsan.supp:print_suppressions=0"
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 300
echo "sanitize: no findings"
