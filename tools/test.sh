#!/usr/bin/env bash
# The README's test command: install what is missing, then run every test
# (and, with no arguments, tools/check_threads.sh and tools/fuzz.sh).
# Extra arguments go to `bazel test` (e.g. a target pattern).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
targets=("$@")
if ((${#targets[@]} == 0)); then targets=(//...); fi
bazel test "${targets[@]}"
# A full run also checks lock discipline (clang -Wthread-safety and TSan on
# the core tests, one clang build): about 4 min the first time on 2 cores,
# seconds after that; then fuzzes the request decoders and validators, the
# three targets side by side for 20 s: about 2 min the first time (the clang
# build), 45 s after that.
if (($# == 0)); then
  tools/check_threads.sh
  tools/fuzz.sh
fi
