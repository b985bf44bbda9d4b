#!/usr/bin/env bash
# The README's main command: install what is missing, build, and run the
# main job end to end. (Grows into the daemon demo as the daemon lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //...
echo "demo: build complete; the training demo arrives with //ddp and //examples"
