#!/usr/bin/env bash
# Regenerates the committed seed corpus, tests/fuzz/corpus/<target>/, from
# the text protos in tests/fuzz/seeds/<target>/ with `protoc --encode`.
# A seed writes a long string as {{c*N}} (N copies of the character c).
# Usage: tests/fuzz/gen_corpus.sh   (from anywhere; rewrites corpus/)
set -euo pipefail
cd "$(dirname "$0")/../.."

declare -A TYPE=(
  [job_spec]=lockstep.v1.SubmitJobRequest
  [store]=lockstep.fuzz.StoreSession
  [coordinator]=lockstep.fuzz.CoordinatorSession
)
expand() {
  python3 -c 'import re, sys
text = sys.stdin.read()
sys.stdout.write(re.sub(r"\{\{(.)\*(\d+)\}\}", lambda m: m.group(1) * int(m.group(2)), text))'
}

for target in "${!TYPE[@]}"; do
  seeds=tests/fuzz/seeds/$target
  [[ -d $seeds ]] || continue
  out=tests/fuzz/corpus/$target
  rm -rf "$out"
  mkdir -p "$out"
  for seed in "$seeds"/*.txtpb; do
    name=$(basename "$seed" .txtpb)
    expand <"$seed" |
      protoc -Iproto -Itests/fuzz/seeds --encode="${TYPE[$target]}" \
        tests/fuzz/seeds/fuzz_input.proto >"$out/$name"
  done
  echo "gen_corpus: $out: $(ls "$out" | wc -l) inputs, $(cat "$out"/* | wc -c) bytes"
done
