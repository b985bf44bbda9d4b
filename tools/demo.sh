#!/usr/bin/env bash
# The README's main command: install what is missing, build, then run the
# main job end to end: a local coordinator + agent (one lockstepd), a 2-worker
# DDP training job of the mlp example on synthetic data, followed to
# SUCCEEDED; prints its status, the trainer's result and where the logs are.
#
# Env: MODEL (mlp), STEPS (20), STATE (/tmp/lockstep-demo).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build --config=opt //daemon:lockstepd //client:lockstep //examples:train
MODEL="${MODEL:-mlp}"
STEPS="${STEPS:-20}"
export STATE="${STATE:-/tmp/lockstep-demo}"
NPROC=2 deploy/local_demo.sh -- "$PWD/bazel-bin/examples/train" --model "$MODEL" --steps "$STEPS"
