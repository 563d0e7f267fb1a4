#!/usr/bin/env bash
# Builds fuzz/scenario_fuzz (clang, libFuzzer + ASan + UBSan; the `fuzz` preset) in build-fuzz/,
# replays every saved regression input, then fuzzes for FUZZ_SECONDS (default 60) from the seed
# corpus. Any crash, sanitizer report, leak, time-out (> 10 s per input) or > 2 GB of memory
# fails the run; the input that caused it is left in build-fuzz/artifacts/. See docs/trust.md.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
jobs=${JOBS:-2}
build=build-fuzz

cmake --preset fuzz >/dev/null
cmake --build "$build" -j"$jobs" --target scenario_fuzz
fuzzer="$build/scenario_fuzz"

# Regression inputs: each once, without mutation.
if compgen -G "fuzz/regressions/*.json" >/dev/null; then
  echo "fuzz: replaying $(ls fuzz/regressions | wc -l) regression inputs"
  "$fuzzer" -timeout=10 -rss_limit_mb=2048 fuzz/regressions/*.json >/dev/null 2>"$build/replay.log" ||
    { cat "$build/replay.log"; echo "fuzz: a regression input fails again" >&2; exit 1; }
fi

seeds="$build/seeds"
corpus="$build/corpus"  # grows across local runs; CI starts from the seeds
rm -rf "$seeds" "$build/artifacts"
mkdir -p "$corpus" "$build/artifacts"
fuzz/make_corpus.sh "$seeds"

echo "fuzz: scenario_fuzz for ${seconds} s"
"$fuzzer" "$corpus" "$seeds" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -dict=fuzz/scenario.dict -artifact_prefix="$build/artifacts/" -print_final_stats=1 \
  2>"$build/fuzz.log" || {
  tail -n 60 "$build/fuzz.log"
  echo "fuzz: FINDING; input saved in $build/artifacts/:" >&2
  ls -l "$build/artifacts/" >&2
  exit 1
}
grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)" "$build/fuzz.log" || true
echo "fuzz: no findings"
