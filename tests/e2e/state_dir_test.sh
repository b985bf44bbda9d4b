#!/usr/bin/env bash
# The state dir holds the tokens and the job table. A daemon refuses a state
# dir another uid owns and a token symlink in it, each with an error naming
# the path and why (and starts nothing); it takes read and write access to a
# state dir away from group and others (0777 becomes 0711) and says so; its
# token files and coordinator.db are 0600.
source tests/e2e/lib.sh "$@"

# refused DIR WANT [flags]: lockstepd exits non-zero and its log says WANT.
refused() {
  local dir=$1 want=$2; shift 2
  local rc=0
  timeout 20 "$LOCKSTEPD" --coordinator --listen 127.0.0.1:0 --state-dir "$dir" \
    --address-file "$dir.addr" "$@" >"$dir.out" 2>&1 || rc=$?
  [ "$rc" != 0 ] || fail "lockstepd started with $dir: $(cat "$dir.out")"
  grep -qF -- "$want" "$dir.out" || fail "lockstepd's error for $dir does not say '$want': $(cat "$dir.out")"
  [ ! -s "$dir.addr" ] || fail "lockstepd wrote an address for $dir"
}

if [ "$(id -u)" = 0 ]; then
  mkdir -p "$T/foreign"
  chown 65534:65534 "$T/foreign"
  refused "$T/foreign" "state dir $T/foreign is owned by uid 65534, not by this daemon's uid 0"
  log "a state dir of another uid is refused"
else
  log "SKIP the foreign-owner case: needs root to chown"
fi

mkdir -p "$T/linked"
echo "attacker-chosen-token" >"$T/elsewhere"
chmod 600 "$T/elsewhere"
ln -s "$T/elsewhere" "$T/linked/token"
refused "$T/linked" "token file $T/linked/token in the state dir is a symlink; refusing it"
log "a token symlink in the state dir is refused"

mkdir -p "$T/coord"
chmod 0777 "$T/coord"
start_coordinator
# Search access stays (workers of other uids reach their job dir by path).
[ "$(stat -c %a "$T/coord")" = 711 ] || fail "the state dir is mode $(stat -c %a "$T/coord"), not 711"
grep -q "state dir $T/coord was mode 0777, readable or writable by group or others; made it 0711" "$T/coord.log" ||
  fail "the daemon did not say it closed the state dir: $(cat "$T/coord.log")"
for f in token viewer.token agent.token coordinator.db; do
  [ "$(stat -c %a "$T/coord/$f")" = 600 ] || fail "$f is mode $(stat -c %a "$T/coord/$f"), not 600"
done
log "PASS: foreign state dir and token symlink refused; an open state dir closed to 0711; state files 0600"
