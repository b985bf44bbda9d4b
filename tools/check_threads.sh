#!/usr/bin/env bash
# Lock discipline: compiles the core targets with clang's -Wthread-safety
# (warnings are errors) and runs the core tests under ThreadSanitizer.
# Usage: tools/check_threads.sh [thread-safety|tsan]   (default: both)
#
# Both in one clang build: --config=tsan carries -Werror=thread-safety too,
# so every core target is compiled once under it without linking (the
# analysis is the compiler's: compilation_outputs), and the TSan tests then
# link and run from the same objects. `thread-safety` alone builds
# --config=thread-safety (unoptimised, no sanitizer: the quick check).
#
# The thread-safety build covers every target of common/, rendezvous/,
# daemon/ and client/ (gRPC shells included; ddp/ and examples/ are LibTorch).
# TSan runs only their tests whose binary links neither gRPC nor LibTorch:
# Debian builds neither with TSan, and synchronization inside an
# uninstrumented library is invisible to it, so those tests would report
# races that are not there (rendezvous:store_service_test does, inside gRPC's
# own threads). The plain cores (store, coordinator, agent, launcher) are
# tested with fakes, so they are all in. Lock types: common/mutex.h.
# Each config builds into its own output tree (.bazelrc): the first run
# compiles everything once; later runs are incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

CORE=(//common/... //rendezvous/... //daemon/... //client/...)
# The tests among them whose binary links neither gRPC nor LibTorch.
tsan_tests() {
  local core
  core=$(IFS=+; echo "${CORE[*]}")
  bazel query --noshow_progress \
    "tests($core) except rdeps($core, //third_party:grpc + //third_party:torch)"
}

command -v clang >/dev/null || { echo "check_threads: clang is missing (tools/setup.sh)" >&2; exit 2; }
which=${1:-both}
case $which in
  both)
    echo "check_threads: clang -Wthread-safety -Werror=thread-safety, every core target (TSan build)"
    bazel build --config=tsan --output_groups=compilation_outputs "${CORE[@]}"
    ;;
  thread-safety)
    echo "check_threads: clang -Wthread-safety -Werror=thread-safety"
    bazel build --config=thread-safety "${CORE[@]}"
    ;;
  tsan) ;;
  *) echo "usage: tools/check_threads.sh [thread-safety|tsan]" >&2; exit 2 ;;
esac
if [[ $which == both || $which == tsan ]]; then
  echo "check_threads: ThreadSanitizer"
  mapfile -t tests < <(tsan_tests)
  bazel test --config=tsan "${tests[@]}"
fi
echo "check_threads: OK"
