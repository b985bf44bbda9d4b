#!/usr/bin/env bash
# ddp_bench prints one JSON line per run with the fields bench/README.md and
# the issue name, for DDP and for the --local baseline. (Schema only: speed
# is compared in bench/README.md, never asserted here.) With --comm-hook the
# line names the hook, and fp16/bf16 show half the bytes_reduced of the
# default allreduce.
set -euo pipefail
bench="$1"
train="$2"
# Every run below works under this TMPDIR: a run that measured leaves
# nothing there, one that failed keeps (and names) its directory.
export TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}/bench_tmp"
mkdir -p "$TMPDIR"
allreduce_bytes=""
for mode in "" "--local" "--comm-hook=fp16" "--comm-hook=bf16" "--comm-hook=adasum"; do
  line=$("$bench" --train "$train" --model mlp_small --world 2 --steps 3 --warmup 1 --bucket-mb 1 $mode)
  echo "$line"
  bytes=$(MODE="$mode" ALLREDUCE_BYTES="$allreduce_bytes" /usr/bin/python3 -c '
import json, os, sys
lines = [l for l in sys.stdin.read().splitlines() if l.startswith("{")]
assert len(lines) == 1, "expected one JSON line, got %r" % lines
d = json.loads(lines[0])
for k in ("system", "model", "world", "backend", "bucket_mb", "step_ms_median", "samples_per_s",
          "comm_hook", "bytes_reduced"):
    assert k in d, "missing field %s in %s" % (k, d)
mode = os.environ["MODE"]
assert d["system"] == "lockstep" and d["model"] == "mlp_small" and d["world"] == 2, d
assert d["backend"] == ("local" if mode == "--local" else "gloo"), d
assert d["step_ms_median"] > 0 and d["samples_per_s"] > 0, d
hook = mode.split("=")[1] if mode.startswith("--comm-hook=") else "allreduce"
assert d["comm_hook"] == hook, d
if mode == "":
    assert d["bytes_reduced"] > 0, d
elif mode in ("--comm-hook=fp16", "--comm-hook=bf16"):
    assert 2 * d["bytes_reduced"] == int(os.environ["ALLREDUCE_BYTES"]), d
print(int(d["bytes_reduced"]))
' <<<"$line")
  [ -z "$mode" ] && allreduce_bytes="$bytes"
done
if "$bench" --train "$train" --model mlp_small --world 1 --steps 1 --comm-hook=fp8 2>/dev/null; then
  echo "FAIL: an unknown comm hook was accepted"; exit 1
fi
# The options that are off by default reach train only when set: a train
# that refuses them (as one built before they existed does) runs the default
# configuration, and is refused when --overlap-forward is asked for.
strict="${TEST_TMPDIR:-$(mktemp -d)}/strict_train"
cat >"$strict" <<SH
#!/usr/bin/env bash
for a in "\$@"; do
  case "\$a" in
    --overlap-optimizer*|--gradient-priority*|--overlap-forward*)
      echo "strict_train: unknown flag \$a" >&2; exit 2 ;;
  esac
done
exec "$(realpath "$train")" "\$@"
SH
chmod +x "$strict"
"$bench" --train "$strict" --model mlp_small --world 2 --steps 2 --warmup 1 --bucket-mb 1 >/dev/null ||
  { echo "FAIL: the default run passed an option that is off by default"; exit 1; }
err=$("$bench" --train "$strict" --model mlp_small --world 2 --steps 2 --warmup 1 --bucket-mb 1 \
  --overlap-forward 2>&1 >/dev/null) && { echo "FAIL: --overlap-forward was not passed on"; exit 1; }
grep -q "strict_train: unknown flag --overlap-forward" <<<"$err" ||
  { echo "FAIL: --overlap-forward did not reach train: $err"; exit 1; }
left=$(find "$TMPDIR" -maxdepth 1 -name 'ddp_bench_*')
# The two failed runs above (--comm-hook=fp8, --overlap-forward) kept their
# directories and named them; the runs that measured left nothing.
grep -q "see $TMPDIR/ddp_bench_" <<<"$err" || { echo "FAIL: the failed run did not name its directory: $err"; exit 1; }
[ "$(wc -l <<<"$left")" = 2 ] || { echo "FAIL: expected only the 2 failed runs' directories, found: $left"; exit 1; }
for bad in "--world 0" "--steps 0" "--batch 0" "--warmup -1"; do
  err=$("$bench" --train "$train" --model mlp_small $bad 2>&1) && { echo "FAIL: $bad accepted"; exit 1; }
  grep -qF -- "${bad%% *}: expected" <<<"$err" || { echo "FAIL: $bad: $err"; exit 1; }
done
echo PASS
