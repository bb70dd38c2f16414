#!/usr/bin/env bash
# Live migration of a real, separate, writing process: gpumigrate-workload (the
# source, linked with the shim) -> migrate -> receive -> gpumigrate-workload
# --adopt (the destination), all on 127.0.0.1 and bounded by `timeout`. The
# destination checks every page against the source's version table at stop, and
# both dump a hash per page (source at release, destination at adoption) that
# must be identical.
# Usage: proc_migration_test.sh path/to/gpumigrate path/to/gpumigrate-workload
set -uo pipefail
bin=$1
wl=$2
tmp=$(mktemp -d)
export GPUMIGRATE_SHIM_DIR=$tmp
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail=0
source "$(dirname "$0")/lib.sh"


start_receiver() {  # start_receiver NAME DEVICE: sets $port and $rpid
  local name=$1 dev=$2
  rm -f "$tmp/$name.port"
  timeout 120 "$bin" receive --listen 127.0.0.1:0 --port-file "$tmp/$name.port" --device "$dev" --insecure-no-tls \
    --resume-window 3s --json >"$tmp/$name.recv.json" 2>"$tmp/$name.recv.err" &
  rpid=$!
  pids+=("$rpid")
  for _ in $(seq 100); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
  port=$(cat "$tmp/$name.port" 2>/dev/null)
}

# migrate_case NAME TRACKER WORKLOAD-ARGS...: a whole migration with the tracker forced.
migrate_case() {
  local name=$1 tracker=$2; shift 2
  start_workload "$name.src" --size 32MiB --rate 40MB/s "$@" --dump-hashes "$tmp/$name.src.hashes"
  local spid=$wpid stpid=$tpid
  start_workload "$name.dst" --size 32MiB --adopt --run-after 300ms "$@" --dump-hashes "$tmp/$name.dst.hashes"
  local dpid=$wpid dtpid=$tpid
  start_receiver "$name" "proc:$dpid"
  local dev="proc:$spid"
  [ "$tracker" != auto ] && dev="$dev,tracker=$tracker"
  # --no-scrub: the source dumps its page hashes after the release, to be compared with the destination's
  # (the in-process proc tests check the scrub).
  timeout 120 "$bin" migrate --to "127.0.0.1:$port" --device "$dev" --insecure-no-tls --streams 2 --warmup 300ms \
    --no-scrub --json >"$tmp/$name.json" 2>"$tmp/$name.err"
  check "$name: migrate" 0 $?
  wait "$rpid"; check "$name: receive" 0 $?
  wait "$stpid"; check "$name: source workload exits after release" 0 $?
  wait "$dtpid"; check "$name: destination workload checks itself and runs on" 0 $?
  contains "$name: source was released" "$tmp/$name.src.out" "released at step"
  contains "$name: destination adopted every page" "$tmp/$name.dst.out" "pages equal to the source at stop"
  contains "$name: destination ran on" "$tmp/$name.dst.out" "ran on to step"
  if cmp -s "$tmp/$name.src.hashes" "$tmp/$name.dst.hashes"; then
    echo "ok: $name: destination memory equals the source's at stop, page for page"
  else
    echo "FAIL: $name: page hashes differ"; fail=1
  fi
  python3 - "$tmp/$name.json" "$tracker" "$name" <<'PY' || fail=1
import json, sys
r = json.loads(open(sys.argv[1]).read())
ok = r["outcome"] == "completed" and r["verified"] and len(r["rounds"]) >= 2
if not ok:
    print(f"FAIL: {sys.argv[3]}: report {json.dumps(r)[:500]}"); sys.exit(1)
print(f"ok: {sys.argv[3]}: report completed, verified, {len(r['rounds'])} rounds, stun {r['stun_ms']:.1f} ms")
PY
  local want=$tracker
  [ "$tracker" = auto ] && want=hash
  contains "$name: tracker named" "$tmp/$name.err" "dirty tracking: $want"
}

migrate_case pagemap_memfd pagemap-scan --memory memfd
migrate_case pagemap_thp pagemap-scan --memory thp
migrate_case syncwp_anon sync-wp --memory anon
migrate_case hash_memfd hash --memory memfd
# Writes through a second mapping (as DMA would land) of a region flagged --dma:
# auto tracking must choose hashing, and nothing may be missed.
migrate_case dma_alias auto --memory memfd --dma --write-via alias

# The source workload killed mid pre-copy: a clear error, exit 1, the receiver discards.
start_workload kill.src --size 64MiB --rate 20MB/s
kpid=$wpid
ktpid=$tpid
start_workload kill.dst --size 64MiB --adopt
kdpid=$wpid
kdtpid=$tpid
start_receiver kill "proc:$kdpid"
timeout 60 "$bin" migrate --to "127.0.0.1:$port" --device "proc:$kpid" --insecure-no-tls --bandwidth 16MB/s \
  --warmup 10ms >"$tmp/kill.out" 2>"$tmp/kill.err" &
mpid=$!
sleep 1.5
kill -9 "$kpid"
wait "$ktpid" 2>/dev/null
wait "$mpid"; check "workload killed: migrate fails" 1 $?
contains "workload killed: the error says so" "$tmp/kill.out" "exited\|is gone\|no longer registered"
wait "$rpid"; check "workload killed: receive aborts" 1 $?
if kill -0 "$kdpid" 2>/dev/null; then echo "ok: destination workload keeps waiting (discarded)"; else echo "FAIL: destination workload died"; fail=1; fi
kill "$kdpid" 2>/dev/null; wait "$kdtpid" 2>/dev/null

# gpumigrate killed mid pre-copy: the workload runs on, and its memory is intact.
start_workload gone.src --size 64MiB --rate 20MB/s --run-for 4s
gpid=$wpid
gtpid=$tpid
start_workload gone.dst --size 64MiB --adopt
gdpid=$wpid
start_receiver gone "proc:$gdpid"
timeout 60 "$bin" migrate --to "127.0.0.1:$port" --device "proc:$gpid" --insecure-no-tls --bandwidth 16MB/s \
  --warmup 10ms >"$tmp/gone.out" 2>"$tmp/gone.err" &
mpid=$!
sleep 1.5
kill -9 "$mpid"
wait "$gtpid"; check "engine killed: the workload ran on and checked its memory" 0 $?
contains "engine killed: self-check" "$tmp/gone.src.out" "self-check at exit: 16384 pages OK"
wait "$rpid"; check "engine killed: receive aborts" 1 $?
kill "$gdpid" 2>/dev/null

# Resolving commands refuse a workload that is not held; estimate observes a
# live process without disturbing it.
start_workload idle --size 4MiB --rate 1MB/s
itpid=$tpid
# Its first use calibrates the proc backend's path: real migrations of
# gpumigrate-workload processes (small ones here), stored under .../proc.
GPUMIGRATE_WORKLOAD=$wl GPUMIGRATE_PATH_CALIBRATION_SIZE=32MiB timeout 120 "$bin" estimate --device "proc:$wpid" \
  --sample 300ms --warmup 10ms --json >"$tmp/est.json" 2>"$tmp/est.err"
check "estimate of a live process" 0 $?
contains "the proc path is calibrated with workload processes" "$tmp/est.err" \
  "calibrating the path tls/2/none/uncapped/proc"
python3 - "$tmp/est.json" "$tmp/calibration-paths.json" <<'PY' || fail=1
import json, sys
r = json.loads(open(sys.argv[1]).read())
ok = r["decision"] in ("live-migrate", "drain-and-replace", "cannot-converge") and r["predicted_stun_ms"] >= 0
print(("ok" if ok else "FAIL") + f": estimate decision {r['decision']}, predicted stun {r['predicted_stun_ms']:.1f} ms")
key = r.get("path_calibration", {}).get("key")
stored = json.load(open(sys.argv[2]))["paths"].get("tls/2/none/uncapped/proc", {})
good = key == "tls/2/none/uncapped/proc" and stored.get("backend") == "proc" and "gpumigrate-workload" in \
    stored.get("method", "") and stored.get("fixed_ms", -1) >= 0
print(("ok" if good else "FAIL") + f": modelled on the proc path ({key}), stored: {stored.get('method')}")
sys.exit(0 if ok and good else 1)
PY
# Without a workload binary to calibrate with, the sim path stands in and the
# estimate says so (another cap: nothing stored for it yet).
GPUMIGRATE_WORKLOAD=$tmp/none GPUMIGRATE_PATH_CALIBRATION_SIZE=16MiB timeout 120 "$bin" estimate \
  --device "proc:$wpid" --link 300MB/s --sample 300ms --warmup 10ms --json >"$tmp/est2.json" 2>"$tmp/est2.err"
check "estimate of a live process without gpumigrate-workload" 0 $?
contains "the missing workload is named" "$tmp/est2.err" "GPUMIGRATE_WORKLOAD $tmp/none is not an executable"
contains "the sim path stands in" "$tmp/est2.json" "the sim path's figures stand in for them"
"$bin" resume --device "proc:$wpid" >"$tmp/resume.out" 2>&1; check "resume of a running workload" 1 $?
contains "resume says why" "$tmp/resume.out" "not held"
"$bin" receive --listen 127.0.0.1:0 --device "proc:$wpid" --insecure-no-tls --accept-timeout 1s >"$tmp/role.out" 2>&1
check "a running workload is no destination" 2 $?
contains "role error" "$tmp/role.out" "not a destination waiting to adopt"
kill "$wpid"
wait "$itpid"; check "the observed workload ran on intact" 0 $?
contains "observed workload self-check" "$tmp/idle.out" "self-check at exit: 1024 pages OK"

exit $fail
