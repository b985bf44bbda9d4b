#!/usr/bin/env bash
# A launch that cannot succeed on retry (a missing or non-executable
# program, a missing working dir, an unknown user) fails the job at once, naming the cause,
# with its restart budget untouched. The CLI resolves a relative program
# against the directory it runs in (or --working-dir).
source tests/e2e/lib.sh "$@"

start_coordinator

# submit_cmd [flags] -- CMD ARGS: submits CMD as given, prints the job id.
submit_cmd() {
  ls_cli submit --detach --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])'
}

# expect_launch_error JOB TEXT: FAILED without a restart, and the message
# says which rank could not be launched and contains TEXT.
expect_launch_error() {
  local job=$1 text=$2 msg
  wait_state "$job" FAILED 30
  msg=$(job_field "$job" 'j["message"]')
  [ "$(job_field "$job" 'j.get("restart_count", 0)')" = 0 ] || fail "job $job was restarted: $msg"
  [ "$(job_field "$job" 'j["first_failure"]["exit"].get("launch_error", False)')" = True ] ||
    fail "job $job: first failure is not marked as a launch error"
  case "$msg" in
    "rank 0 on node coord could not be launched: "*"$text"*"; not retried (a restart cannot fix a launch error)") ;;
    *) fail "job $job: message lacks '$text': $msg" ;;
  esac
  log "ok: $msg"
}

job=$(submit_cmd --max-restarts 3 -- /nonexistent/train "$MARKER")
expect_launch_error "$job" 'launch /nonexistent/train: exec "/nonexistent/train": No such file or directory'

printf '#!/bin/sh\nexit 0\n' >"$T/noexec.sh"
chmod 644 "$T/noexec.sh"
job=$(submit_cmd --max-restarts 3 -- "$T/noexec.sh" "$MARKER")
expect_launch_error "$job" "exec \"$T/noexec.sh\": Permission denied"

job=$(submit_cmd --max-restarts 3 --working-dir "$T/no-such-dir" -- /bin/true "$MARKER")
expect_launch_error "$job" "launch /bin/true: chdir to working dir $T/no-such-dir: No such file or directory"

job=$(submit_cmd --max-restarts 3 -- lockstep-no-such-program "$MARKER")
expect_launch_error "$job" 'exec "lockstep-no-such-program": No such file or directory (not found in PATH='

# A user the node does not know (looked up before any switch, root or not).
job=$(submit_cmd --max-restarts 3 --run-as lockstep-no-such-user -- /bin/true "$MARKER")
expect_launch_error "$job" 'run_as: no such user "lockstep-no-such-user"'

# ./ok.sh from the directory that holds it: the CLI sends the absolute path.
mkdir -p "$T/proj/sub"
printf '#!/bin/sh\npwd >"%s/out/$1.pwd"\n' "$T" >"$T/proj/ok.sh"
chmod 755 "$T/proj/ok.sh"
job=$(cd "$T/proj" && submit_cmd --max-restarts 3 -- ./ok.sh cwd "$MARKER")
wait_state "$job" SUCCEEDED 30
[ "$(job_field "$job" 'j["spec"]["command"][0]')" = "$T/proj/ok.sh" ] ||
  fail "the CLI sent $(job_field "$job" 'j["spec"]["command"][0]'), not $T/proj/ok.sh"

# With a relative --working-dir, both are taken from here, and the program
# from the working dir (where the worker would look for it).
cp "$T/proj/ok.sh" "$T/proj/sub/ok.sh"
job=$(cd "$T/proj" && submit_cmd --working-dir sub -- ./ok.sh wd "$MARKER")
wait_state "$job" SUCCEEDED 30
[ "$(job_field "$job" 'j["spec"]["working_dir"]')" = "$T/proj/sub" ] || fail "working dir not made absolute"
[ "$(job_field "$job" 'j["spec"]["command"][0]')" = "$T/proj/sub/ok.sh" ] || fail "program not resolved in the working dir"
[ "$(cat "$T/out/wd.pwd")" = "$T/proj/sub" ] || fail "the worker ran in $(cat "$T/out/wd.pwd"), not $T/proj/sub"

check_invariants "$job" 0
log "PASS"
