#!/usr/bin/env bash
# The torchrun habit across two hosts, no daemon: ranks of //examples:train
# started by hand in two network namespaces joined by a veth pair, with
# MASTER_ADDR a host name, as `torchrun --master-addr $(hostname)` gives.
# Each host's /etc/hosts (ip netns exec reads /etc/netns/NS/hosts) maps that
# name as Debian does on the host that holds it: to 127.0.1.1 on host A,
# where rank 0 runs, and to host A's address on host B. Rank 0 serves the
# job's store on every interface (as torch's TCPStore does), so rank 1
# reaches it; bound to MASTER_ADDR's address here it listened on 127.0.1.1
# only and rank 1 waited it out. Both ranks end with the same checksum as one
# host's run of the same job.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
NET="10.215.$(($$ % 250))"
two_hosts tr "$NET"
NAME="trainhost$$"
mkdir -p "/etc/netns/$NSA" "/etc/netns/$NSB"
EXTRA_CLEANUP="$EXTRA_CLEANUP; rm -rf '/etc/netns/$NSA' '/etc/netns/$NSB'"
printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$NAME" > "/etc/netns/$NSA/hosts"
printf '127.0.0.1 localhost\n%s %s\n' "$NET.1" "$NAME" > "/etc/netns/$NSB/hosts"
[ "$(ip netns exec "$NSA" getent hosts "$NAME" | awk '{print $1}')" = 127.0.1.1 ] &&
  [ "$(ip netns exec "$NSB" getent hosts "$NAME" | awk '{print $1}')" = "$NET.1" ] ||
  fail "the per-host /etc/hosts did not take: $(ip netns exec "$NSB" getent hosts "$NAME")"

PORT=29511
TOKEN_VALUE=$(openssl rand -hex 32)
# rank NS IFACE RANK: one rank in NS, its Gloo on IFACE, output in $T/rank-RANK.{out,err}.
rank() {
  local ns=$1 iface=$2 r=$3
  ip netns exec "$ns" env -u LOCKSTEP_STORE LOCKSTEP_RANK="$r" LOCKSTEP_WORLD_SIZE=2 \
    MASTER_ADDR="$NAME" MASTER_PORT="$PORT" LOCKSTEP_STORE_TOKEN="$TOKEN_VALUE" \
    GLOO_SOCKET_IFNAME="$iface" "$TRAIN" --model mlp_small --steps 5 --seed 3 --timeout-s 30 \
    > "$T/rank-$r.out" 2> "$T/rank-$r.err" &
  eval "PID_$r=$!"
}
rank "$NSA" "$VA" 0
rank "$NSB" "$VB" 1
wait "$PID_0" || fail "rank 0 failed: $(tail -n 5 "$T/rank-0.err")"
wait "$PID_1" || fail "rank 1 failed: $(tail -n 5 "$T/rank-1.err")"
grep -q "rank 0 serves the job's store on every interface, port $PORT (MASTER_ADDR $NAME is not loopback" "$T/rank-0.err" ||
  fail "rank 0 did not say where it serves the store: $(grep -m3 store "$T/rank-0.err")"
checksum() { sed -n 's/.*"checksum":\([^,]*\),.*/\1/p' "$T/$1.out" | tail -n 1; }
got0=$(checksum rank-0) got1=$(checksum rank-1)
[ -n "$got0" ] && [ "$got0" = "$got1" ] || fail "the ranks disagree: '$got0' / '$got1'"

# The same job on one host (loopback) gives the same parameters.
env -u LOCKSTEP_STORE LOCKSTEP_RANK=0 LOCKSTEP_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
  "$TRAIN" --model mlp_small --steps 5 --seed 3 --timeout-s 30 > "$T/ref-0.out" 2> "$T/ref-0.err" &
ref0=$!
env -u LOCKSTEP_STORE LOCKSTEP_RANK=1 LOCKSTEP_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" \
  "$TRAIN" --model mlp_small --steps 5 --seed 3 --timeout-s 30 > "$T/ref-1.out" 2> "$T/ref-1.err"
wait "$ref0" || fail "the one-host reference failed: $(tail -n 3 "$T/ref-0.err")"
[ "$(checksum ref-0)" = "$got0" ] || fail "two hosts gave $got0, one host $(checksum ref-0)"
log "PASS: checksum $got0 on both hosts, as on one"
