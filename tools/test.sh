#!/usr/bin/env bash
# The README's test command: install what is missing, then run every test.
# Extra arguments go to `bazel test` (e.g. a target pattern).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
targets=("$@")
if ((${#targets[@]} == 0)); then targets=(//...); fi
bazel test "${targets[@]}"
