#!/usr/bin/env bash
# Bounded fuzzing (tests/fuzz/README.md): builds the libFuzzer targets with
# clang, ASan and UBSan (--config=fuzz) and runs each for SECONDS on a copy
# of its committed corpus (tests/fuzz/corpus/<target>), all side by side, in
# one process each. Nothing leaves the machine; the committed corpus is never
# written. Exits non-zero when any target finds a crash, sanitizer report,
# leak, timeout (-timeout) or memory blow-up (-rss_limit_mb), printing the
# reproducer's path and the command that replays it (the targets' ends are
# taken in a fixed order, so a failure is printed once the targets before it
# in that order have ended).
# Usage: tools/fuzz.sh [SECONDS]   (default 20, all targets at once)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
[[ $seconds =~ ^[0-9]+$ ]] && ((seconds > 0)) || { echo "usage: tools/fuzz.sh [SECONDS]" >&2; exit 2; }
TARGETS=(job_spec store coordinator)
command -v clang >/dev/null || { echo "fuzz: clang is missing (tools/setup.sh)" >&2; exit 2; }

labels=()
for t in "${TARGETS[@]}"; do labels+=("//tests/fuzz:${t}_fuzzer"); done
echo "fuzz: building ${labels[*]} (clang, libFuzzer, ASan, UBSan)"
# ld.gold warns once per ASan register-check symbol it cannot export: noise.
if ! bazel build --config=fuzz "${labels[@]}" 2>&1 | { grep -v "Cannot export local symbol '__asan" || true; }; then
  echo "fuzz: build failed" >&2
  exit 1
fi
bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz

work=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-fuzz.XXXXXX")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# The targets fuzz side by side (one process each, sharing the cores), so
# the run takes SECONDS rather than SECONDS per target.
declare -A pids
for t in "${TARGETS[@]}"; do
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$work/$t/corpus/"
  "$bin/${t}_fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -entropic=0 \
    -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" "$work/$t/corpus" \
    >"$work/$t/log" 2>&1 &
  pids[$t]=$!
done
failed=0
for t in "${TARGETS[@]}"; do
  log=$work/$t/log
  rc=0
  wait "${pids[$t]}" || rc=$?
  if ((rc != 0)); then
    failed=1
    # What failed (an invariant, a sanitizer, libFuzzer's own limits), then
    # where libFuzzer saved the input.
    grep -E -m1 -A2 'FUZZ_CHECK failed|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" >&2 || true
    grep -E '^(SUMMARY|MS:|artifact_prefix)' "$log" >&2 || true
    for a in "$work/$t/artifacts"/*; do
      [[ -e $a ]] || continue
      echo "fuzz: $t FAILED (exit $rc); reproducer: $a" >&2
      echo "fuzz: replay: $bin/${t}_fuzzer $a" >&2
    done
    echo "fuzz: $t FAILED (exit $rc); full log: $log" >&2
    continue
  fi
  # "#N DONE cov: C ft: F corp: K/S ... exec/s: E" and the final stats.
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(sed -E -n 's/.* cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+)\/.*/\1 edges, \2 features, corpus \3/p' <<<"$done_line")
  echo "fuzz: $t: ${seconds}s, $runs inputs ($rate/s), $cov (from $(ls tests/fuzz/corpus/"$t" | wc -l) seeds): OK"
done
((failed == 0)) || exit 1
rm -rf "$work"
echo "fuzz: OK"
