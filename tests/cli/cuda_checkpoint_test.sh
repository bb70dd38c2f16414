#!/usr/bin/env bash
# `gpumigrate cuda state|suspend|resume` against processes running on the CUDA
# driver double (libcuda-fake.so): the exit codes of the CLI contract, --json,
# and every refusal in words. tests/support/cuda/fake_app.cc is the CUDA process;
# it loops copying its device memory back and verifying it.
# Usage: cuda_checkpoint_test.sh gpumigrate libcuda-fake.so libcuda-fake-old.so cuda_fake_app
set -uo pipefail
bin=$1
fake=$2
fake_old=$3
app=$4
tmp=$(mktemp -d)
export GPUMIGRATE_LIBCUDA=$fake
export GPUMIGRATE_FAKE_CUDA_DIR=$tmp
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail=0
source "$(dirname "$0")/lib.sh"

# progress NAME FIELD: a counter of the app's progress file (tests/support/cuda/fake_app.h:
# ready, failed, last_error, then 64-bit iterations, verify_failures).
progress() {
  python3 - "$tmp/$1.progress" "$2" <<'PY'
import struct, sys
v = struct.unpack_from("<IIiIQQ", open(sys.argv[1], "rb").read())
print({"ready": v[0], "failed": v[1], "iterations": v[4], "verify_failures": v[5]}[sys.argv[2]])
PY
}

# slow_inside PID: calls of PID now inside a GPUMIGRATE_FAKE_CUDA_SLOW sleep
# (tests/support/cuda/fake/fake_shared_state.h: SharedState.slow_calls_inside).
slow_inside() {
  python3 - "$tmp/gm-fake-cuda.$1" <<'PY'
import struct, sys
print(struct.unpack_from("<IIiiQiII", open(sys.argv[1], "rb").read())[7])
PY
}

# start_app NAME [ENV=VALUE...]: sets $apid once the app has filled its memory.
start_app() {
  local name=$1; shift
  truncate -s 4096 "$tmp/$name.progress"
  # env execs the app: $! is the app's own pid (the exit trap kills it).
  env "$@" "$app" "$tmp/$name.progress" 2>"$tmp/$name.err" &
  apid=$!
  pids+=("$apid")
  for _ in $(seq 400); do [ "$(progress "$name" ready)" = 1 ] && return 0; sleep 0.05; done
  echo "FAIL: $name: the fake app did not start"; cat "$tmp/$name.err"; fail=1
}

# wait_progress NAME ABOVE: waits until the app's iterations exceed ABOVE.
wait_progress() {
  for _ in $(seq 400); do [ "$(progress "$1" iterations)" -gt "$2" ] && return 0; sleep 0.05; done
  return 1
}

start_app a
"$bin" cuda state "$apid" >"$tmp/state.out" 2>&1; check "state of a CUDA process" 0 $?
contains "state says RUNNING" "$tmp/state.out" "process $apid: RUNNING"
"$bin" cuda state "$apid" --json >"$tmp/state.json"; check "state --json" 0 $?
json_check "$tmp/state.json" "r['state'] == 'RUNNING' and r['pid'] == $apid and r['restore_tid'] > 0" "state JSON"

"$bin" cuda suspend "$apid" --json >"$tmp/suspend.json" 2>"$tmp/suspend.err"; check "suspend" 0 $?
json_check "$tmp/suspend.json" "r['outcome'] == 'suspended' and r['state'] == 'CHECKPOINTED'" "suspend JSON"
"$bin" cuda state "$apid" >"$tmp/state2.out" 2>&1
contains "suspended process is CHECKPOINTED" "$tmp/state2.out" "CHECKPOINTED"
"$bin" cuda suspend "$apid" >"$tmp/again.out" 2>&1; check "suspend of a held process refused, held (3)" 3 $?
contains "refusal names the state" "$tmp/again.out" "it is CHECKPOINTED, not RUNNING"

frozen=$(progress a iterations)
"$bin" cuda resume "$apid" >"$tmp/resume.out" 2>&1; check "resume" 0 $?
contains "resume says RUNNING" "$tmp/resume.out" "resumed: RUNNING"
if wait_progress a "$frozen"; then echo "ok: the app runs on after resume"; else echo "FAIL: the app did not progress"; fail=1; fi
[ "$(progress a verify_failures)" = 0 ] && echo "ok: memory intact" || { echo "FAIL: memory changed"; fail=1; }
"$bin" cuda resume "$apid" >"$tmp/resume2.out" 2>&1; check "resume of a running process (1)" 1 $?
contains "nothing to resume" "$tmp/resume2.out" "nothing to resume"

# A lock that times out while the app is inside a long call: it stays RUNNING.
start_app slow GPUMIGRATE_FAKE_CUDA_SLOW=cuStreamSynchronize=600000
for _ in $(seq 400); do [ "$(slow_inside "$apid")" -gt 0 ] && break; sleep 0.05; done
"$bin" cuda suspend "$apid" --timeout 100ms --json >"$tmp/timeout.json" 2>"$tmp/timeout.err"
check "lock timeout: failed, still running (1)" 1 $?
contains "timeout named" "$tmp/timeout.err" "cuCheckpointProcessLock failed: CUDA_ERROR_TIMEOUT"
json_check "$tmp/timeout.json" "r['outcome'] == 'failed' and r['state'] == 'RUNNING'" "timeout JSON"
# Under 1 ms is rounded up, not truncated to 0 (= wait for ever): it still times out.
timeout 60 "$bin" cuda suspend "$apid" --timeout 500us >"$tmp/us.out" 2>&1
check "a --timeout under 1 ms times out (1)" 1 $?
contains "sub-ms timeout named" "$tmp/us.out" "cuCheckpointProcessLock failed: CUDA_ERROR_TIMEOUT"

# A checkpoint failing inside the target: unlocked back, RUNNING (1).
start_app tfail GPUMIGRATE_FAKE_CUDA_FAIL=cuCheckpointProcessCheckpoint=2
"$bin" cuda suspend "$apid" --json >"$tmp/tfail.json" 2>"$tmp/tfail.err"
check "a checkpoint failing in the target (1)" 1 $?
json_check "$tmp/tfail.json" "r['outcome'] == 'failed' and r['state'] == 'RUNNING'" "target failure JSON"
frozen=$(progress tfail iterations)
if wait_progress tfail "$frozen"; then echo "ok: the app runs on after the failed checkpoint"; else echo "FAIL: the app stopped"; fail=1; fi
[ "$(progress tfail verify_failures)" = 0 ] && echo "ok: memory intact" || { echo "FAIL: memory changed"; fail=1; }

# Exit codes come from the kind of failure: a lock refused by the driver while
# the process stays RUNNING is 1; a checkpoint and unlock both failing is 3.
GPUMIGRATE_FAKE_CUDA_FAIL=cuCheckpointProcessCheckpoint=2,cuCheckpointProcessUnlock=999 \
  "$bin" cuda suspend "$apid" --json >"$tmp/doubt.json" 2>"$tmp/doubt.err"
check "checkpoint and unlock failing: in doubt (3)" 3 $?
json_check "$tmp/doubt.json" "r['outcome'] == 'failed' and r['state'] == 'LOCKED'" "in-doubt JSON"
"$bin" cuda resume "$apid" >/dev/null 2>&1; check "resume after in doubt" 0 $?
# FAILED is in doubt (3), never "held, memory intact": docs/hardware.md says which.
python3 - "$tmp/gm-fake-cuda.$apid" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(24); f.write(struct.pack("<i", 3))
PY
"$bin" cuda resume "$apid" --json >"$tmp/failed.json" 2>"$tmp/failed.err"; check "resume of a FAILED process (3)" 3 $?
json_check "$tmp/failed.json" "r['state'] == 'FAILED'" "FAILED JSON"
contains "FAILED named" "$tmp/failed.err" "it is FAILED: the driver cannot resume it"

# No CUDA in the process, no process, no driver, a driver without the API or too old.
"$bin" cuda state $$ >"$tmp/nocuda.out" 2>&1; check "a process without CUDA (2)" 2 $?
contains "no CUDA named" "$tmp/nocuda.out" "knows no CUDA state"
GPUMIGRATE_LIBCUDA=/nonexistent/libcuda.so.1 "$bin" cuda suspend "$apid" >"$tmp/nolib.out" 2>&1
check "no driver (2)" 2 $?
contains "dlopen failure named" "$tmp/nolib.out" "could not be loaded (/nonexistent/libcuda.so.1)"
GPUMIGRATE_LIBCUDA=$fake_old "$bin" cuda state "$apid" >"$tmp/old.out" 2>&1; check "no checkpoint API (2)" 2 $?
contains "missing symbol named" "$tmp/old.out" "lacks cuCheckpointProcessGetState"
GPUMIGRATE_FAKE_CUDA_VERSION=12040 "$bin" cuda state "$apid" >"$tmp/v.out" 2>&1; check "driver too old (2)" 2 $?
contains "versions named" "$tmp/v.out" "is version 12.4; the checkpoint API needs 12.8"

# Usage.
"$bin" cuda suspend >/dev/null 2>&1; check "suspend without a pid (2)" 2 $?
"$bin" cuda suspend "$apid" --timeout soon >"$tmp/usage.out" 2>&1; check "a bad --timeout (2)" 2 $?
"$bin" help cuda >"$tmp/help.out" 2>&1; check "help cuda" 0 $?
contains "help names suspend" "$tmp/help.out" "suspend"

exit $fail
