#!/usr/bin/env bash
# Builds the fuzz targets (clang, libFuzzer + ASan + UBSan; the `fuzz` preset) in build-fuzz/,
# replays every saved regression input, then runs scenario_fuzz (bytes → JSON → plan/simulate, from
# the seed corpus) and layout_fuzz (bytes → every scenario field) for FUZZ_SECONDS in all
# (default 60, split evenly). Any crash, sanitizer report, leak, time-out (> 10 s per input) or > 2 GB of memory
# fails the run; the input that caused it is left in build-fuzz/artifacts/. See docs/trust.md.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
jobs=${JOBS:-2}
build=build-fuzz

cmake --preset fuzz >/dev/null
cmake --build "$build" -j"$jobs" --target scenario_fuzz layout_fuzz
fuzzer="$build/scenario_fuzz"

# Regression inputs: each once, without mutation.
if compgen -G "fuzz/regressions/*.json" >/dev/null; then
  echo "fuzz: replaying $(ls fuzz/regressions | wc -l) regression inputs"
  "$fuzzer" -timeout=10 -rss_limit_mb=2048 fuzz/regressions/*.json >/dev/null 2>"$build/replay.log" ||
    { cat "$build/replay.log"; echo "fuzz: a regression input fails again" >&2; exit 1; }
fi

seeds="$build/seeds"
rm -rf "$seeds" "$build/artifacts"
mkdir -p "$build/artifacts"
fuzz/make_corpus.sh "$seeds"

# Corpora grow across local runs in build-fuzz/corpus-*; a fresh CI checkout starts from the seeds.
run() {
  local target=$1 secs=$2
  shift 2
  mkdir -p "$build/corpus-$target"
  echo "fuzz: $target for ${secs} s"
  "$build/$target" "$build/corpus-$target" "$@" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$build/artifacts/$target-" -print_final_stats=1 2>"$build/$target.log" || {
    tail -n 60 "$build/$target.log"
    echo "fuzz: FINDING in $target; input saved in $build/artifacts/:" >&2
    ls -l "$build/artifacts/" >&2
    exit 1
  }
  grep -E "^stat::(number_of_executed_units|peak_rss_mb)" "$build/$target.log" || true
}
run scenario_fuzz $((seconds / 2)) "$seeds" -dict=fuzz/scenario.dict
run layout_fuzz $((seconds - seconds / 2))
echo "fuzz: no findings"
