#!/usr/bin/env bash
# Live migration of a CUDA process's device memory between two processes
# (`migrate --device cuda:PID` / `receive --device cuda:PID`), against the
# driver double libcuda-fake.so (GPUMIGRATE_LIBCUDA): gpumigrate-cuda-workload is
# the source (weights written once, a kv cache rewritten with cuMemcpyHtoD and
# cuMemsetD32) and, in adopt mode, the destination, which checks every byte of
# both regions against the source's version table at stop; both dump a digest
# per 64 KiB that must be identical. Then the failure paths: the application
# killed, the sending gpumigrate killed before and after STOP (runs on / held in
# doubt and resolved with resume and release), the receiving one killed (rolled
# back), the GPU kernel unavailable, mismatched pages, bad specs.
# With `real` in place of the double's path, only the whole migrations run, on the
# machine's GPU through libcuda.so.1 (tests/hardware/cuda_gpu_test.cc).
# Usage: cuda_migration_test.sh gpumigrate gpumigrate-cuda-workload libcuda-fake.so|real HAVE_PTX(ON|OFF)
#        gpumigrate-workload
set -uo pipefail
bin=$1
wl=$2
real=0
if [ "$3" = real ]; then real=1; unset GPUMIGRATE_LIBCUDA; else export GPUMIGRATE_LIBCUDA=$3; fi
have_ptx=$4
host_wl=$5
tmp=$(mktemp -d)
export GPUMIGRATE_SHIM_DIR=$tmp
export GPUMIGRATE_FAKE_CUDA_DIR=$tmp
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail=0
source "$(dirname "$0")/lib.sh"

start_receiver() {  # start_receiver NAME DEVICE [ENV=VALUE...]: sets $port and $rpid
  local name=$1 dev=$2; shift 2
  rm -f "$tmp/$name.port"
  env "$@" timeout 120 "$bin" receive --listen 127.0.0.1:0 --port-file "$tmp/$name.port" --device "$dev" \
    --insecure-no-tls --resume-window 3s --json >"$tmp/$name.recv.json" 2>"$tmp/$name.recv.err" &
  rpid=$!
  pids+=("$rpid")
  for _ in $(seq 100); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
  port=$(cat "$tmp/$name.port" 2>/dev/null)
}

# migrate_case NAME SPEC-SUFFIX WANT-TRACKER [WORKLOAD-ENV...]: a whole migration, every byte checked.
migrate_case() {
  local name=$1 suffix=$2 want=$3; shift 3
  GM_ENV=("$@")
  start_workload_env "$name.src" --weights 16MiB --kv 16MiB --rate 20MB/s --dump-hashes "$tmp/$name.src.hashes"
  local spid=$wpid stpid=$tpid
  start_workload "$name.dst" --weights 16MiB --kv 16MiB --adopt --run-after 300ms \
    --dump-hashes "$tmp/$name.dst.hashes"
  local dpid=$wpid dtpid=$tpid
  start_receiver "$name" "cuda:$dpid$suffix"  # the same page size on both sides
  # --no-scrub: the source dumps its page digests after the release, to be compared
  # with the destination's (the scrub case below checks the scrub).
  timeout 120 "$bin" migrate --to "127.0.0.1:$port" --device "cuda:$spid$suffix" --insecure-no-tls --streams 2 \
    --warmup 300ms ${SCRUB_FLAG---no-scrub} --json >"$tmp/$name.json" 2>"$tmp/$name.err"
  check "$name: migrate" 0 $?
  wait "$rpid"; check "$name: receive" 0 $?
  wait "$stpid"; check "$name: source workload exits after release" 0 $?
  wait "$dtpid"; check "$name: destination checks every byte and runs on" 0 $?
  contains "$name: source was released" "$tmp/$name.src.out" "released at step"
  contains "$name: destination adopted every page" "$tmp/$name.dst.out" "kv pages equal to the source at stop"
  contains "$name: destination ran on" "$tmp/$name.dst.out" "ran on to step"
  if [ -z "${SCRUB_FLAG---no-scrub}" ]; then
    # Scrubbed: every page of the released source is zero (one digest for all), the destination's are not.
    if python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); sys.exit(not d or len({d[i:i+8] for i in range(0, len(d), 8)}) != 1)' \
         "$tmp/$name.src.hashes" && ! cmp -s "$tmp/$name.src.hashes" "$tmp/$name.dst.hashes"; then
      echo "ok: $name: the released source's device memory is zeroed"
    else
      echo "FAIL: $name: the released source's device memory still holds data"; fail=1
    fi
    json_check "$tmp/$name.json" 'r["scrubbed"] is True' "$name: report says the source was scrubbed"
  elif [ -s "$tmp/$name.src.hashes" ] && cmp -s "$tmp/$name.src.hashes" "$tmp/$name.dst.hashes"; then
    echo "ok: $name: destination device memory equals the source's at stop, page for page"
  else
    echo "FAIL: $name: page digests differ"; fail=1
  fi
  json_check "$tmp/$name.json" 'r["outcome"] == "completed" and r["verified"] and len(r["rounds"]) >= 2' \
    "$name: report completed, verified, several rounds"
  contains "$name: tracker named" "$tmp/$name.err" "dirty tracking: $want"
}

# wait_for FILE TEXT: until FILE holds TEXT (at most 20 s), so a kill lands in the phase meant.
wait_for() {
  for _ in $(seq 400); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "FAIL: '$2' never appeared in $1"; fail=1
}

# start_workload with the environment in GM_ENV (fault injection for the driver double).
start_workload_env() {
  local name=$1; shift
  env "${GM_ENV[@]}" timeout 60 "$wl" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  tpid=$!
  pids+=("$tpid")
  wpid=
  for _ in $(seq 200); do
    wpid=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$tmp/$name.out" 2>/dev/null)
    [ -n "$wpid" ] && { pids+=("$wpid"); return 0; }
    sleep 0.05
  done
  echo "FAIL: $name: workload did not start"; cat "$tmp/$name.err"; fail=1
}

auto=host-hash
[ "$have_ptx" = ON ] && auto=gpu-hash
migrate_case auto "" "$auto"
migrate_case host ",hash=host" "host-hash (.*forced (hash=host)"
migrate_case page1m ",page=1MiB" "$auto"
SCRUB_FLAG= migrate_case scrub "" "$auto"

# A live checkpoint to a file (then the source is released) restored into a
# fresh process: every byte checked, digests equal to the source's at stop.
start_workload ck.src --weights 8MiB --kv 8MiB --rate 10MB/s --dump-hashes "$tmp/ck.src.hashes"
ckstpid=$tpid
# --no-scrub: the released source's page digests are compared with the restored process's.
timeout 120 "$bin" checkpoint --device "cuda:$wpid" --to "$tmp/ck.ckpt" --then release --warmup 200ms --no-scrub \
  >"$tmp/ck.out" 2>&1
check "checkpoint of a CUDA process" 0 $?
wait "$ckstpid"; check "checkpoint: the released source exits" 0 $?
start_workload ck.dst --weights 8MiB --kv 8MiB --adopt --run-after 300ms --dump-hashes "$tmp/ck.dst.hashes"
ckdtpid=$tpid
timeout 120 "$bin" restore --from "$tmp/ck.ckpt" --device "cuda:$wpid" >"$tmp/ck.restore" 2>&1
check "restore into a CUDA process" 0 $?
wait "$ckdtpid"; check "restore: the destination checks every byte and runs on" 0 $?
contains "restore: adopted" "$tmp/ck.dst.out" "kv pages equal to the source at stop"
if [ -s "$tmp/ck.src.hashes" ] && cmp -s "$tmp/ck.src.hashes" "$tmp/ck.dst.hashes"; then
  echo "ok: restore: device memory equals the source's at the checkpoint, page for page"
else
  echo "FAIL: restore: page digests differ"; fail=1
fi

[ $real = 1 ] && exit $fail
# No kernel can be loaded (the driver rejects the PTX): auto falls back to host
# hashing and says why.
migrate_case nokernel "" "host-hash (.*cuModuleLoadData" GPUMIGRATE_FAKE_CUDA_FAIL=cuModuleLoadData=200

# hash=gpu where no kernel loads: refused before anything moves, naming why.
GM_ENV=(GPUMIGRATE_FAKE_CUDA_FAIL=cuModuleLoadData=200)
start_workload_env nogpu.src --weights 4MiB --kv 4MiB --rate 1MB/s
ngpid=$wpid
ngtpid=$tpid
timeout 60 "$bin" migrate --to 127.0.0.1:9 --device "cuda:$ngpid,hash=gpu" --insecure-no-tls >"$tmp/nogpu.out" 2>&1
rc=$?
[ "$rc" != 0 ] && echo "ok: hash=gpu without a kernel fails (exit $rc)" || { echo "FAIL: hash=gpu without a kernel succeeded"; fail=1; }
contains "hash=gpu without a kernel: says why" "$tmp/nogpu.out" "hash=gpu is not possible: .*cuModuleLoadData"
kill "$ngpid"; wait "$ngtpid"; check "hash=gpu refused: the workload ran on intact" 0 $?
contains "hash=gpu refused: self-check" "$tmp/nogpu.src.out" "self-check at exit: weights and 64 kv pages OK"

# Page sizes that differ between the two sides: refused in the handshake, naming the region and both.
start_workload pm.src --weights 4MiB --kv 4MiB --rate 1MB/s
pmspid=$wpid
pmstpid=$tpid
start_workload pm.dst --weights 4MiB --kv 4MiB --adopt
pmdpid=$wpid
pmdtpid=$tpid
start_receiver pm "cuda:$pmdpid"
timeout 60 "$bin" migrate --to "127.0.0.1:$port" --device "cuda:$pmspid,page=1MiB" --insecure-no-tls \
  >"$tmp/pm.out" 2>&1
check "page sizes differ: migrate fails and rolls back" 1 $?
contains "page sizes differ: says where" "$tmp/pm.out" \
  "region weights does not fit: source 4194304 bytes in 1048576-byte pages, destination 4194304 bytes in 65536-byte pages"
wait "$rpid"
kill "$pmspid" "$pmdpid"
wait "$pmstpid"; check "page sizes differ: the source ran on intact" 0 $?
wait "$pmdtpid" 2>/dev/null

# The source application killed mid pre-copy: a clear error, exit 1, the receiver discards.
start_workload kill.src --weights 32MiB --kv 32MiB --rate 10MB/s
kpid=$wpid
ktpid=$tpid
start_workload kill.dst --weights 32MiB --kv 32MiB --adopt
kdpid=$wpid
kdtpid=$tpid
start_receiver kill "cuda:$kdpid"
timeout 60 "$bin" migrate --to "127.0.0.1:$port" --device "cuda:$kpid" --insecure-no-tls --bandwidth 8MB/s \
  --warmup 10ms >"$tmp/kill.out" 2>"$tmp/kill.err" &
mpid=$!
wait_for "$tmp/kill.err" "^round 0 .* sent"
kill -9 "$kpid"
wait "$ktpid" 2>/dev/null
wait "$mpid"; check "application killed: migrate fails" 1 $?
contains "application killed: the error says so" "$tmp/kill.out" "exited\|is gone"
wait "$rpid"; check "application killed: receive aborts" 1 $?
if kill -0 "$kdpid" 2>/dev/null; then echo "ok: destination keeps waiting (discarded)"; else echo "FAIL: destination died"; fail=1; fi
kill "$kdpid" 2>/dev/null; wait "$kdtpid" 2>/dev/null

# gpumigrate killed mid pre-copy: the application runs on, its device memory intact.
start_workload gone.src --weights 32MiB --kv 32MiB --rate 10MB/s --run-for 4s
gpid=$wpid
gtpid=$tpid
start_workload gone.dst --weights 32MiB --kv 32MiB --adopt
gdpid=$wpid
start_receiver gone "cuda:$gdpid"
timeout 60 "$bin" migrate --to "127.0.0.1:$port" --device "cuda:$gpid" --insecure-no-tls --bandwidth 8MB/s \
  --warmup 10ms >"$tmp/gone.out" 2>"$tmp/gone.err" &
mpid=$!
wait_for "$tmp/gone.err" "^round 0 .* sent"
kill -9 "$mpid"
wait "$gtpid"; check "gpumigrate killed in pre-copy: the application ran on and checked its memory" 0 $?
contains "gpumigrate killed in pre-copy: self-check" "$tmp/gone.src.out" "self-check at exit: weights and 512 kv pages OK"
wait "$rpid"; check "gpumigrate killed in pre-copy: receive aborts" 1 $?
kill "$gdpid" 2>/dev/null

# The receiving gpumigrate killed once Prepare arrived: the source rolls back and
# runs on; the destination process discards what it got and keeps waiting.
start_workload rk.src --weights 8MiB --kv 8MiB --rate 10MB/s --run-for 6s
rkspid=$wpid
rkstpid=$tpid
start_workload rk.dst --weights 8MiB --kv 8MiB --adopt
rkdpid=$wpid
rkdtpid=$tpid
start_receiver rk "cuda:$rkdpid" GPUMIGRATE_TEST_CRASH_AT=prepare-received
timeout 60 "$bin" migrate --to "127.0.0.1:$port" --device "cuda:$rkspid" --insecure-no-tls --warmup 100ms \
  >"$tmp/rk.out" 2>"$tmp/rk.err"
check "receiver killed at prepare-received: migrate rolls back" 1 $?
wait "$rkstpid"; check "receiver killed: the application ran on and checked its memory" 0 $?
contains "receiver killed: self-check" "$tmp/rk.src.out" "self-check at exit: weights and 128 kv pages OK"
if kill -0 "$rkdpid" 2>/dev/null; then echo "ok: receiver killed: destination keeps waiting"; else echo "FAIL: receiver killed: destination died"; fail=1; fi
kill "$rkdpid" 2>/dev/null; wait "$rkdtpid" 2>/dev/null

# held_case NAME PHASE: gpumigrate (the source) dies at PHASE, after STOP: the
# application stays paused, in doubt; sets $hpid/$htpid (source) and $hdpid/$hdtpid.
held_case() {
  local name=$1 phase=$2
  start_workload "$name.src" --weights 8MiB --kv 8MiB --rate 10MB/s --run-for 20s
  hpid=$wpid htpid=$tpid
  start_workload "$name.dst" --weights 8MiB --kv 8MiB --adopt --adopt-timeout 30s
  hdpid=$wpid hdtpid=$tpid
  start_receiver "$name" "cuda:$hdpid"
  GPUMIGRATE_TEST_CRASH_AT=$phase timeout 60 "$bin" migrate --to "127.0.0.1:$port" --device "cuda:$hpid" \
    --insecure-no-tls --warmup 100ms >"$tmp/$name.out" 2>"$tmp/$name.err"
  check "$name: gpumigrate killed at $phase" 137 $?
  wait "$rpid"
  wait_for "$tmp/$name.src.err" "stays paused (in doubt) until \`gpumigrate resume --device cuda:$hpid\`" &&
    echo "ok: $name: the shim says the workload stays paused, in doubt"
}

# Killed after Prepare: the destination never commits; the operator resumes the source.
held_case held_resume prepare-sent
kill "$hdpid" 2>/dev/null
"$bin" resume --device "cuda:$hpid" >"$tmp/held_resume.resume" 2>&1; check "in doubt: resume the source" 0 $?
contains "in doubt: resume says so" "$tmp/held_resume.resume" "resumed: RUNNING"
kill "$hpid"
wait "$htpid"; check "in doubt, resumed: the application ran on and checked its memory" 0 $?
contains "in doubt, resumed: self-check" "$tmp/held_resume.src.out" "self-check at exit: weights and 128 kv pages OK"

# Killed after Commit: the destination runs it; the operator releases the source.
held_case held_release commit-sent
wait "$hdtpid"; check "committed: the destination adopted and checked every byte" 0 $?
"$bin" release --device "cuda:$hpid" >"$tmp/held_release.release" 2>&1; check "in doubt: release the source" 0 $?
wait "$htpid"; check "released: the source exits" 0 $?
contains "released: the source knows it moved" "$tmp/held_release.src.out" "released at step"
"$bin" resume --device "cuda:$hpid" >"$tmp/gone.resume" 2>&1
[ $? != 0 ] && echo "ok: resume of an exited process fails" || { echo "FAIL: resume of an exited process"; fail=1; }

# Bad specs and wrong processes: usage errors naming what and where.
bad_spec() {  # NAME SPEC TEXT
  timeout 30 "$bin" migrate --to 127.0.0.1:9 --device "$2" --insecure-no-tls >"$tmp/$1.out" 2>&1
  check "bad spec $2: exit code" 2 $?
  contains "bad spec $2: message" "$tmp/$1.out" "$3"
}
bad_spec nopid "cuda:" "PID must be a positive number"
bad_spec badhash "cuda:1,hash=fpga" "unknown hash 'fpga'"
bad_spec badpage "cuda:1,page=3000" "page must be a power of two"
bad_spec bigpage "cuda:1,page=2MiB" "to 1.00 MiB (a page travels in one frame)"
bad_spec badkey "cuda:1,tracker=hash" "unknown key 'tracker'"
bad_spec nosuch "cuda:999999" "process 999999 does not exist"
# A process whose shim has only host memory is no cuda: device.
cwl=$wl
wl=$host_wl
start_workload host.src --size 4MiB --rate 1MB/s
hopid=$wpid
hotpid=$tpid
wl=$cwl
timeout 30 "$bin" migrate --to 127.0.0.1:9 --device "cuda:$hopid" --insecure-no-tls >"$tmp/hostonly.out" 2>&1
[ $? != 0 ] && echo "ok: cuda: of a host-only workload fails" || { echo "FAIL: cuda: of a host-only workload"; fail=1; }
contains "cuda: of a host-only workload: says why" "$tmp/hostonly.out" \
  "process $hopid registered no CUDA regions (gm_shim_register_cuda): it is a host workload, use proc:$hopid"
kill "$hopid"; wait "$hotpid"; check "the host workload ran on" 0 $?

exit $fail
