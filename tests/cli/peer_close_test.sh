#!/usr/bin/env bash
# Issue 19: a peer that closes first, or dies, at each phase of the protocol,
# between two real processes over loopback TLS (external PSK). Whatever happens,
# neither process is killed by SIGPIPE (exit 141): the survivor exits 1 (rolled
# back, source RUNNING) or 3 (in doubt, after Prepared) with the reason in its
# report. Peers die at exact points through GPUMIGRATE_TEST_CRASH_AT (SIGKILL of
# itself at a phase); a damaged frame comes from tests/support/fault_proxy.py.
# Every process is bounded by `timeout`; only 127.0.0.1 is used.
# Usage: peer_close_test.sh path/to/gpumigrate
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
source "$here/lib.sh"
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
openssl rand -hex 32 >"$tmp/psk"
dev="sim:size=64MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms"

# expect NAME RC ALLOWED...: RC must be one of ALLOWED.
expect() {
  local name=$1 rc=$2; shift 2
  for a in "$@"; do [ "$rc" = "$a" ] && { echo "ok: $name (exit $rc)"; return; }; done
  echo "FAIL: $name: exit $rc, expected one of: $*"
  fail=1
}


# start_receiver NAME [ENV=VALUE...]: sets $port and $rpid.
start_receiver() {
  local name=$1; shift
  rm -f "$tmp/$name.port"
  env "$@" timeout 60 "$bin" receive --listen 127.0.0.1:0 --port-file "$tmp/$name.port" --device "$dev" \
    --psk-file "$tmp/psk" --json --run-after 50ms --resume-window 3s >"$tmp/$name.recv.json" 2>"$tmp/$name.recv.err" &
  rpid=$!
  pids+=("$rpid")
  for _ in $(seq 200); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
  port=$(cat "$tmp/$name.port" 2>/dev/null)
  [ -n "$port" ] || { echo "FAIL: $name: receiver did not start"; cat "$tmp/$name.recv.err"; fail=1; }
}

# migrate NAME PORT [ENV=VALUE...]: runs the source in the foreground; sets $mrc.
migrate() {
  local name=$1 to=$2; shift 2
  env "$@" timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:"$to" --psk-file "$tmp/psk" --streams 2 \
    --bandwidth 150MB/s --warmup 20ms --json >"$tmp/$name.json" 2>"$tmp/$name.err"
  mrc=$?
}

source_rolled_back='r["outcome"] == "aborted" and "RUNNING" in r["resolution"]'

# 1. A frame damaged in flight (the reproduction in the issue), three times: the
#    destination rejects it and closes; the source reports the destination's reason.
for i in 1 2 3; do
  start_receiver flip$i
  rm -f "$tmp/proxy$i.port"
  timeout 60 python3 "$here/../support/fault_proxy.py" "$tmp/proxy$i.port" "$port" --flip-after $((4 << 20)) \
    --seconds 50 2>"$tmp/proxy$i.err" &
  ppid=$!
  pids+=("$ppid")
  for _ in $(seq 100); do [ -s "$tmp/proxy$i.port" ] && break; sleep 0.05; done
  migrate flip$i "$(cat "$tmp/proxy$i.port")"
  expect "damaged frame #$i: migrate" $mrc 1
  wait $rpid; expect "damaged frame #$i: receive" $? 1
  kill $ppid 2>/dev/null
  json_check "$tmp/flip$i.json" "$source_rolled_back"' and "destination aborted" in r["error"] and "authentication failed" in r["error"]' \
    "damaged frame #$i: the source reports the destination's reason and runs on"
done

# 2. The destination dies at each phase while the source writes.
crash_destination() {  # NAME PHASE EXPECTED-RC JSON-CHECK
  start_receiver "$1" GPUMIGRATE_TEST_CRASH_AT="$2"
  migrate "$1" "$port"
  expect "destination dies at $2: migrate" $mrc "$3"
  wait $rpid 2>/dev/null
  json_check "$tmp/$1.json" "$4" "destination dies at $2: the source's report says so"
}
crash_destination d_hs handshake 1 "$source_rolled_back"' and "the destination closed the connection during handshake" in r["error"]'
crash_destination d_r0 round-end:0 1 "$source_rolled_back"' and "the destination closed the connection during " in r["error"]'
crash_destination d_prep prepare-received 1 "$source_rolled_back"' and "the destination closed the connection during switchover" in r["error"]'
crash_destination d_commit prepared-sent 3 'r["outcome"] == "in_doubt" and "the destination closed the connection during commit" in r["error"]'

# 3. The source dies while the destination writes (RoundApplied, Prepared, Running); the hook fires after the phase's message went out.
crash_source() {  # NAME PHASE ALLOWED-RCS JSON-CHECK
  start_receiver "$1"
  migrate "$1" "$port" GPUMIGRATE_TEST_CRASH_AT="$2"
  expect "source dies at $2: migrate is killed by the hook" $mrc 137
  wait $rpid; local rrc=$?
  expect "source dies at $2: receive" $rrc $3
  json_check "$tmp/$1.recv.json" "$4" "source dies at $2: the receiver's report says so"
}
crash_source s_r0 round-end:0 1 'r["outcome"] == "aborted" and "the source closed the connection during pre-copy round" in r["error"]'
# Prepare arrives; Prepared goes to a dead peer: rolled back if that write fails, in doubt if it was buffered.
crash_source s_prep prepare-sent "1 3" 'r["outcome"] in ("aborted", "in_doubt") and "the source closed the connection" in r["error"]'
# Commit arrived before the source died: the destination runs (its Running goes nowhere).
crash_source s_commit commit-sent 0 'r["outcome"] == "completed" and r["verified"]'

# 4. A reader of our own output that goes away (`| head -c 1`): progress and the
#    report then go to a closed pipe; neither side may die of SIGPIPE (141).
start_receiver pipe
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:"$port" --psk-file "$tmp/psk" --streams 2 \
  --bandwidth 150MB/s --warmup 20ms --json 2>&1 | head -c 1 >/dev/null
expect "stdout and stderr closed by their reader: migrate" "${PIPESTATUS[0]}" 0
wait $rpid; expect "stdout and stderr closed by their reader: receive" $? 0

exit $fail
