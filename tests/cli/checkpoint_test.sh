#!/usr/bin/env bash
# Checkpoint files through the CLI, as a user runs them: a live checkpoint of a
# running sim device, info, verify, restore into a fresh device (which runs and
# self-checks), one flipped byte refused naming where, an encrypted file and its
# key, a live process (gpumigrate-workload) checkpointed and restored into a
# fresh process page for page, gpumigrate SIGKILLed mid-write (the earlier file
# intact, the workload running), and a full disk (a small tmpfs, when this
# machine lets the test mount one).
# Usage: checkpoint_test.sh path/to/gpumigrate path/to/gpumigrate-workload
set -uo pipefail
bin=$1
wl=$2
tmp=$(mktemp -d)
export GPUMIGRATE_SHIM_DIR=$tmp
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
pids=()
mounted=
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ -n "$mounted" ] && umount "$mounted" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
source "$(dirname "$0")/lib.sh"
dev="sim:size=64MiB,hot=8MiB,page=64KiB"

# 1. Live checkpoint of a running sim, info, verify, restore.
timeout 120 "$bin" checkpoint --device "$dev" --to "$tmp/a.ckpt" --warmup 100ms --bandwidth 200MB/s --json \
  >"$tmp/a.json" 2>"$tmp/a.err"
check "checkpoint: live checkpoint of a running sim" 0 $?
json_check "$tmp/a.json" 'r["outcome"] == "completed" and r["verified"] and len(r["rounds"]) >= 2 and r["checkpoint"]["source_fate"] == "resume" and r["stun_ms"] > 0' \
  "checkpoint: report completed, verified, pre-copy rounds and a stun"
[ -e "$tmp/a.ckpt.partial" ] && { echo "FAIL: a partial file was left"; fail=1; }
timeout 60 "$bin" checkpoint info "$tmp/a.ckpt" >"$tmp/info.out" 2>&1
check "checkpoint info" 0 $?
contains "checkpoint info: names the device" "$tmp/info.out" "device:     sim:size=64MiB"
timeout 60 "$bin" checkpoint verify "$tmp/a.ckpt" --json >"$tmp/verify.json" 2>"$tmp/verify.err"
check "checkpoint verify" 0 $?
json_check "$tmp/verify.json" 'r["verified"] and r["frames"] > 0' "checkpoint verify: every record checked"
timeout 60 "$bin" restore --from "$tmp/a.ckpt" --device "$dev" --run-after 300ms --json >"$tmp/r.json" 2>"$tmp/r.err"
check "restore into a fresh device" 0 $?
json_check "$tmp/r.json" 'r["outcome"] == "completed" and r["verified"] and r["destination"]["self_check"] == "ok"' \
  "restore: completed, verified, the restored workload ran and self-checked"

# 2. One flipped byte: refused, naming file, record and byte; exit 1.
cp "$tmp/a.ckpt" "$tmp/bad.ckpt"
python3 -c "
import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); b=f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0]^1]))" \
  "$tmp/bad.ckpt" 3000000
timeout 60 "$bin" restore --from "$tmp/bad.ckpt" --device "$dev" >"$tmp/bad.out" 2>&1
check "restore of a file with one flipped byte fails" 1 $?
contains "restore: the error names the file, record and byte" "$tmp/bad.out" "bad.ckpt: record [0-9]* at byte [0-9]*"
contains "restore: nothing reached the device" "$tmp/bad.out" "nothing was written to the device"

# 3. Encrypted at rest: the right key restores, a wrong or missing key is exit 2.
openssl rand 32 >"$tmp/k"
openssl rand 32 >"$tmp/k2"
timeout 120 "$bin" checkpoint --device "$dev" --to "$tmp/e.ckpt" --key-file "$tmp/k" --stop-first --json \
  >"$tmp/e.json" 2>"$tmp/e.err"
check "checkpoint --key-file --stop-first" 0 $?
json_check "$tmp/e.json" 'r["checkpoint"]["encrypted"] and len(r["rounds"]) == 1' "encrypted stop-and-copy checkpoint"
timeout 60 "$bin" checkpoint verify "$tmp/e.ckpt" --key-file "$tmp/k2" >"$tmp/wk.out" 2>&1
check "verify with a wrong key" 2 $?
contains "wrong key named" "$tmp/wk.out" "wrong key"
timeout 60 "$bin" restore --from "$tmp/e.ckpt" --device "$dev" >"$tmp/nk.out" 2>&1
check "restore without the key" 2 $?
timeout 60 "$bin" restore --from "$tmp/e.ckpt" --device "$dev" --key-file "$tmp/k" >"$tmp/rk.out" 2>&1
check "restore with the key" 0 $?

# 4. Incremental over a.ckpt: smaller first round, restores through the chain.
timeout 120 "$bin" checkpoint --device "$dev" --to "$tmp/i.ckpt" --base "$tmp/a.ckpt" --warmup 100ms --json \
  >"$tmp/i.json" 2>"$tmp/i.err"
check "incremental checkpoint" 0 $?
json_check "$tmp/i.json" 'r["checkpoint"]["chain_depth"] == 1 and r["rounds"][0]["known_pages"] > 0' \
  "incremental: its first round skips pages the base holds"
timeout 60 "$bin" restore --from "$tmp/i.ckpt" --device "$dev" --json >"$tmp/ir.json" 2>"$tmp/ir.err"
check "restore through the chain" 0 $?

# 5. A live process: checkpoint (then release), restore into a fresh process.
start_workload p.src --size 32MiB --rate 40MB/s --dump-hashes "$tmp/p.src.hashes"
spid=$wpid; stpid=$tpid
# --no-scrub: the released source's page hashes are compared with the restored process's.
timeout 120 "$bin" checkpoint --device "proc:$spid" --to "$tmp/p.ckpt" --then release --warmup 200ms --no-scrub --json \
  >"$tmp/p.json" 2>"$tmp/p.err"
check "checkpoint of a live process" 0 $?
wait "$stpid"; check "the released source process exits" 0 $?
start_workload p.dst --size 32MiB --adopt --run-after 300ms --dump-hashes "$tmp/p.dst.hashes"
dpid=$wpid; dtpid=$tpid
timeout 60 "$bin" restore --from "$tmp/p.ckpt" --device "proc:$dpid" >"$tmp/pr.out" 2>&1
check "restore into a fresh process" 0 $?
wait "$dtpid"; check "the restored process checks itself and runs on" 0 $?
contains "restored process: every page equal to the source at stop" "$tmp/p.dst.out" "pages equal to the source at stop"
if cmp -s "$tmp/p.src.hashes" "$tmp/p.dst.hashes"; then
  echo "ok: restored memory equals the source's at its stop, page for page"
else
  echo "FAIL: page hashes differ between the source at release and the restored process"; fail=1
fi

# 6. gpumigrate SIGKILLed mid-write: the earlier file stays intact and verifies,
# the partial one is refused, the workload runs on with its memory intact.
start_workload k.src --size 64MiB --rate 20MB/s --run-for 4s
kpid=$wpid; ktpid=$tpid
cp "$tmp/a.ckpt" "$tmp/k.ckpt"
before=$(sha256sum <"$tmp/k.ckpt")
timeout 60 "$bin" checkpoint --device "proc:$kpid" --to "$tmp/k.ckpt" --bandwidth 16MB/s --warmup 10ms \
  >"$tmp/k.out" 2>"$tmp/k.err" &
cpid=$!
sleep 1.5
kill -9 "$cpid"
wait "$cpid" 2>/dev/null
[ "$(sha256sum <"$tmp/k.ckpt")" = "$before" ] && echo "ok: killed writer: the earlier file is untouched" || {
  echo "FAIL: killed writer changed the earlier file"; fail=1; }
timeout 60 "$bin" checkpoint verify "$tmp/k.ckpt" >/dev/null 2>&1
check "killed writer: the earlier file still verifies" 0 $?
if [ -e "$tmp/k.ckpt.partial" ]; then
  timeout 60 "$bin" checkpoint verify "$tmp/k.ckpt.partial" >"$tmp/kp.out" 2>&1
  check "killed writer: the partial file is refused" 1 $?
  contains "killed writer: the partial file is named incomplete" "$tmp/kp.out" "truncated\|interrupted"
fi
wait "$ktpid"; check "killed writer: the workload ran on and checked its memory" 0 $?
contains "killed writer: self-check" "$tmp/k.src.out" "self-check at exit: 16384 pages OK"

# 7. A full disk: the checkpoint fails cleanly, the source runs on, the earlier
# file in that folder is intact and nothing partial is left.
mkdir -p "$tmp/small"
if mount -t tmpfs -o size=12m tmpfs "$tmp/small" 2>/dev/null; then
  mounted="$tmp/small"
  timeout 60 "$bin" checkpoint --device "sim:size=4MiB,hot=512KiB,page=64KiB" --to "$tmp/small/old.ckpt" >/dev/null 2>&1
  check "disk full: an earlier small checkpoint fits" 0 $?
  old=$(sha256sum <"$tmp/small/old.ckpt")
  timeout 60 "$bin" checkpoint --device "$dev" --to "$tmp/small/old.ckpt" --json >"$tmp/full.json" 2>"$tmp/full.err"
  check "disk full: the checkpoint fails and rolls back" 1 $?
  json_check "$tmp/full.json" '"No space left on device" in r["error"] and r["outcome"] == "aborted"' \
    "disk full: the error says the disk is full"
  [ "$(sha256sum <"$tmp/small/old.ckpt")" = "$old" ] && echo "ok: disk full: the earlier file is untouched" || {
    echo "FAIL: disk full: the earlier file changed"; fail=1; }
  [ -e "$tmp/small/old.ckpt.partial" ] && { echo "FAIL: disk full: a partial file was left"; fail=1; } || \
    echo "ok: disk full: no partial file left"
  timeout 60 "$bin" checkpoint verify "$tmp/small/old.ckpt" >/dev/null 2>&1
  check "disk full: the earlier file still verifies" 0 $?
else
  echo "skip: disk full: this machine does not let the test mount a tmpfs"
fi

exit $fail
