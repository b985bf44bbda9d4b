#!/usr/bin/env bash
# Checks --repo_env=LOCKSTEP_LIBTORCH (third_party/libtorch.bzl) with the one
# LibTorch this machine has: a prefix of symlinks to Debian's 1.13 laid out
# as the LibTorch zip is (include/, lib/, share/cmake/Torch/). Builds
# //examples:train against it, checks that the binary loads the prefix's
# libraries, runs 2 ranks over the file store (identical checksums), then
# checks that a prefix without LibTorch fails naming the missing file, and
# rebuilds against Debian's default.
#   tools/check_libtorch_prefix.sh      (about 2 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"; bazel build //examples:train >/dev/null 2>&1 || true' EXIT
fail() { echo "check_libtorch_prefix: FAIL: $*" >&2; exit 1; }

prefix="$work/libtorch"
mkdir -p "$prefix/include" "$prefix/lib" "$prefix/share/cmake/Torch"
for d in ATen c10 torch caffe2; do ln -s "/usr/include/$d" "$prefix/include/$d"; done
for l in torch torch_cpu c10; do
  for f in /usr/lib/x86_64-linux-gnu/lib$l.so /usr/lib/x86_64-linux-gnu/lib$l.so.[0-9]*; do
    ln -s "$f" "$prefix/lib/$(basename "$f")"
  done
done
ln -s /usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake "$prefix/share/cmake/Torch/"

bazel build --repo_env=LOCKSTEP_LIBTORCH="$prefix" //examples:train
grep -q "$prefix/lib/libtorch_cpu.so" <<<"$(ldd bazel-bin/examples/train)" ||
  fail "train does not load the prefix's libtorch_cpu: $(ldd bazel-bin/examples/train | grep torch)"
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCKSTEP_JOB_ID=prefix-check LOCKSTEP_STORE="file:$work/store" \
    timeout 120 bazel-bin/examples/train --model mlp_small --steps 5 >"$work/rank$r.log" 2>&1 &
done
wait
sums=$(for r in 0 1; do sed -n 's/.*"checksum":\([^,]*\),.*/\1/p' "$work/rank$r.log"; done)
[ "$(echo "$sums" | wc -l)" = 2 ] && [ "$(echo "$sums" | sort -u | wc -l)" = 1 ] ||
  fail "2 ranks did not end with one checksum: $sums"

if out=$(bazel build --repo_env=LOCKSTEP_LIBTORCH="$work/none" //examples:train 2>&1); then
  fail "a prefix without LibTorch built"
fi
grep -q "is not a LibTorch prefix: $work/none/include/ATen/ATen.h is missing" <<<"$out" ||
  fail "no clear error for a prefix without LibTorch: $(echo "$out" | grep -m3 -i error)"
echo "check_libtorch_prefix: PASS (train built against $prefix, 2 ranks agree: $(echo "$sums" | head -n 1))"
