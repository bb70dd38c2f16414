#!/usr/bin/env bash
# Two gpumigrate processes over loopback TCP: receive + migrate. Every process is
# bounded by `timeout`; only 127.0.0.1 is used.
# Usage: net_migration_test.sh path/to/gpumigrate
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail=0
source "$(dirname "$0")/lib.sh"
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
export GPUMIGRATE_PATH_CALIBRATION_SIZE=24MiB  # the probe calibrates its path first: small, for sanitizers

# start_receiver NAME DEVICE [ARGS...]: runs `receive` in the background; sets $port and $rpid.
# Without TLS arguments it runs --insecure-no-tls.
start_receiver() {
  local name=$1 dev=$2; shift 2
  local sec=(--insecure-no-tls)
  [[ " $* " == *" --tls-"* || " $* " == *" --psk-file "* ]] && sec=()
  rm -f "$tmp/$name.port"
  timeout 120 "$bin" receive --listen 127.0.0.1:0 --port-file "$tmp/$name.port" --device "$dev" \
    "${sec[@]}" --json --run-after 100ms "$@" >"$tmp/$name.recv.json" 2>"$tmp/$name.recv.err" &
  rpid=$!
  pids+=("$rpid")
  for _ in $(seq 100); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
  port=$(cat "$tmp/$name.port" 2>/dev/null)
  [ -n "$port" ] || { echo "FAIL: $name: receiver did not start"; cat "$tmp/$name.recv.err"; fail=1; }
}


dev="sim:size=64MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms"

# 1. One stream, no compression.
start_receiver one "$dev"
timeout 120 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --insecure-no-tls --streams 1 --warmup 50ms \
  --json >"$tmp/one.json" 2>"$tmp/one.err"
check "migrate over 1 stream" 0 $?
wait $rpid; check "receive over 1 stream" 0 $?
json_check "$tmp/one.json" 'r["outcome"] == "completed" and r["verified"] and len(r["rounds"]) >= 2' "source completed and verified"
json_check "$tmp/one.json" 'r["scrubbed"] is True and "zeroed" in r["scrub"]' "the released source's memory is zeroed"
json_check "$tmp/one.recv.json" 'r["outcome"] == "completed" and r["verified"] and r["destination"]["self_check"] == "ok"' \
  "destination verified and its workload self-checks after resume"

# 2. Several streams with compression on a capped link.
start_receiver multi "$dev"
timeout 120 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --insecure-no-tls --streams 3 --codec zstd \
  --bandwidth 200MB/s --downtime-target 50ms --warmup 50ms --no-scrub --json >"$tmp/multi.json" 2>/dev/null
check "migrate over 3 streams with zstd" 0 $?
wait $rpid; check "receive over 3 streams" 0 $?
json_check "$tmp/multi.json" 'r["outcome"] == "completed" and r["compression_ratio"] > 1.2' "compressed over 3 streams"
json_check "$tmp/multi.json" 'r["scrubbed"] is False and "--no-scrub" in r["scrub"]' "--no-scrub leaves the source and says so"
json_check "$tmp/multi.recv.json" 'r["destination"]["self_check"] == "ok"' "destination self-check after 3 streams"

# 2b. Paced through a rate file (how the agent paces an evacuation's migrations):
#     at 512KB/s the 64 MiB would take over two minutes; the file is lifted once
#     the session's phase file says round 0 runs, and the migration then ends
#     within its 60 s bound. The phase file holds the session's phase as JSON.
echo "512KB/s" >"$tmp/pace.rate"
start_receiver pace "$dev"
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --insecure-no-tls --streams 2 --warmup 10ms \
  --bandwidth-file "$tmp/pace.rate" --phase-file "$tmp/pace.phase" --no-scrub --json >"$tmp/pace.json" 2>/dev/null &
ppid=$!
pids+=("$ppid")
for _ in $(seq 400); do grep -q '"round-start"' "$tmp/pace.phase" 2>/dev/null && break; sleep 0.05; done
contains "the phase file says round 0 runs" "$tmp/pace.phase" '"phase": "round-start", "round": 0'
sleep 1
contains "still in round 0 a second later at 512KB/s" "$tmp/pace.phase" '"round": 0'
echo 0 >"$tmp/pace.rate.tmp" && mv "$tmp/pace.rate.tmp" "$tmp/pace.rate"
wait $ppid; check "a paced migration completes once its rate file lifts the cap" 0 $?
wait $rpid; check "receive of the paced migration" 0 $?
json_check "$tmp/pace.json" 'r["outcome"] == "completed" and r["verified"]' "paced migration completed and verified"
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); sys.exit(0 if p["phase"] in ("completed", "commit-sent") else 1)' \
  "$tmp/pace.phase"; check "the phase file ends at the session's end" 0 $?
timeout 30 "$bin" migrate --device "$dev" --to 127.0.0.1:1 --insecure-no-tls --bandwidth-file "$tmp/none.rate" \
  >/dev/null 2>"$tmp/norate.err"
check "a missing rate file is a usage error" 2 $?
contains "it names the file" "$tmp/norate.err" "none.rate"

# 3. The receiver is killed with SIGKILL mid-migration: the source aborts and keeps running.
big="sim:size=256MiB,hot=2MiB,kv_rate=16MiB/s,page=64KiB,step=2ms"
start_receiver kill "$big"
timeout 120 "$bin" migrate --device "$big" --to 127.0.0.1:$port --insecure-no-tls --streams 2 --bandwidth 40MB/s \
  --warmup 10ms --json >"$tmp/kill.json" 2>/dev/null &
mpid=$!
pids+=("$mpid")
sleep 1.5
pkill -KILL -P $rpid  # the receiver itself, not the `timeout` around it
kill -9 $rpid 2>/dev/null
wait $mpid; check "migrate exits 1 when the receiver dies" 1 $?
json_check "$tmp/kill.json" 'r["outcome"] == "aborted" and "RUNNING" in r["resolution"] and ("closed" in r["error"] or "reset" in r["error"].lower() or "pipe" in r["error"].lower())' \
  "receiver killed: aborted with the source RUNNING"

# 3b. migrate started before the receiver listens: it retries refused connections
#     until --connect-timeout, and the receiver listens before it allocates.
free_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:$free_port --insecure-no-tls --warmup 10ms \
  --connect-timeout 20s --json >"$tmp/early.json" 2>"$tmp/early.err" &
epid=$!
pids+=("$epid")
sleep 1
timeout 60 "$bin" receive --listen 127.0.0.1:$free_port --device "$dev" --insecure-no-tls --json --run-after 50ms \
  >"$tmp/early.recv.json" 2>"$tmp/early.recv.err" &
erpid=$!
pids+=("$erpid")
wait $epid; check "migrate started 1 s before the receiver" 0 $?
wait $erpid; check "the receiver it waited for" 0 $?
json_check "$tmp/early.json" 'r["outcome"] == "completed" and r["verified"]' "an early source reaches a late receiver"

# 4. Devices that do not match: refused at the manifest, on both sides.
start_receiver mismatch "sim:size=32MiB,hot=2MiB,page=16KiB"
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --insecure-no-tls --warmup 10ms --json \
  >"$tmp/mm.json" 2>/dev/null
check "mismatched devices: migrate" 1 $?
wait $rpid; check "mismatched devices: receive" 1 $?
json_check "$tmp/mm.json" '"does not fit" in r["error"] or "regions" in r["error"]' "mismatch names the region"

# 5. Nobody listening (the first receiver's port, now closed).
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:$(cat "$tmp/one.port") --insecure-no-tls --warmup 10ms --connect-timeout 2s \
  --json >"$tmp/refused.json" 2>/dev/null
check "no receiver" 1 $?
json_check "$tmp/refused.json" '"refused" in r["error"] and r["failed_phase"] == "connect"' "connection refused is reported"

# 6. TLS is the default: without TLS options the insecure mode must be asked for by name.
"$bin" migrate --device "$dev" --to 127.0.0.1:1 >"$tmp/tls.err" 2>&1; check "migrate without TLS options" 2 $?
grep -q "insecure-no-tls" "$tmp/tls.err" && echo "ok: message names the option" || { echo "FAIL: no hint"; fail=1; }
"$bin" receive --listen 127.0.0.1:0 >"$tmp/tls2.err" 2>&1; check "receive without TLS options" 2 $?
"$bin" receive --listen 127.0.0.1:0 --insecure-no-tls --psk-file x >"$tmp/tls3.err" 2>&1
check "insecure and TLS at once" 2 $?

# 6b. TLS 1.3 with mutual certificates; AES-256-GCM data.
certs="$tmp/certs"
"$(dirname "$0")/../../scripts/make-test-certs" "$certs" 2>/dev/null
"$(dirname "$0")/../../scripts/make-test-certs" "$tmp/other" 2>/dev/null
src_tls=(--tls-ca "$certs/ca.pem" --tls-cert "$certs/source.pem" --tls-key "$certs/source.key")
start_receiver tls "$dev" --tls-ca "$certs/ca.pem" --tls-cert "$certs/dest.pem" --tls-key "$certs/dest.key"
timeout 120 "$bin" migrate --device "$dev" --to 127.0.0.1:$port "${src_tls[@]}" --streams 2 --warmup 10ms --json \
  >"$tmp/tls.json" 2>/dev/null
check "migrate over TLS with certificates" 0 $?
wait $rpid; check "receive over TLS" 0 $?
json_check "$tmp/tls.json" '"TLSv1.3" in r["security"] and "AES-256-GCM" in r["security"] and r["verified"]' "TLS 1.3 + AES-256-GCM"
json_check "$tmp/tls.recv.json" 'r["destination"]["self_check"] == "ok"' "destination self-check over TLS"

# 6c. A source whose certificate another CA signed is refused.
start_receiver badcert "$dev" --tls-ca "$certs/ca.pem" --tls-cert "$certs/dest.pem" --tls-key "$certs/dest.key" \
  --accept-timeout 20s
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --tls-ca "$certs/ca.pem" \
  --tls-cert "$tmp/other/source.pem" --tls-key "$tmp/other/source.key" --warmup 10ms --json >"$tmp/badcert.json" 2>/dev/null
check "wrong certificate: migrate" 1 $?
wait $rpid; check "wrong certificate: receive" 1 $?
json_check "$tmp/badcert.json" '"TLS handshake refused" in r["error"] and r["failed_phase"] == "connect"' "wrong certificate is a handshake error"
grep -q "handshake as server failed" "$tmp/badcert.recv.err" && echo "ok: receiver names the handshake" || { echo "FAIL: receiver"; cat "$tmp/badcert.recv.err"; fail=1; }

# 6d. External PSK; then a wrong one.
openssl rand -hex 32 >"$tmp/psk"; openssl rand -hex 32 >"$tmp/psk2"
start_receiver psk "$dev" --psk-file "$tmp/psk"
timeout 120 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --psk-file "$tmp/psk" --warmup 10ms --json \
  >"$tmp/psk.json" 2>/dev/null
check "migrate with a PSK" 0 $?
wait $rpid; check "receive with a PSK" 0 $?
json_check "$tmp/psk.json" '"external PSK" in r["security"] and r["verified"]' "PSK session"
start_receiver badpsk "$dev" --psk-file "$tmp/psk" --accept-timeout 20s
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --psk-file "$tmp/psk2" --warmup 10ms --json \
  >"$tmp/badpsk.json" 2>/dev/null
check "wrong PSK: migrate" 1 $?
wait $rpid; check "wrong PSK: receive" 1 $?
json_check "$tmp/badpsk.json" '"handshake" in r["error"]' "wrong PSK is a handshake error"

# 7. Something that is not gpumigrate connects first.
start_receiver garbage "$dev" --accept-timeout 10s
python3 -c "
import socket,sys
s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=5); s.sendall(b'GET / HTTP/1.0\r\n\r\n'+b'x'*64); s.close()" "$port"
wait $rpid; check "receiver refuses a stranger" 1 $?
grep -q "bad preamble magic" "$tmp/garbage.recv.err" && echo "ok: stranger named" || { echo "FAIL: no magic error"; cat "$tmp/garbage.recv.err"; fail=1; }

# 8. Probe over the network: pre-copy, then abort on purpose.
start_receiver probe "$dev"
timeout 120 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --insecure-no-tls --dry-run --sample 300ms \
  --warmup 10ms --json >"$tmp/probe.json" 2>/dev/null
check "migrate --dry-run" 0 $?
wait $rpid; check "receiver of a probe discards (exit 1)" 1 $?
json_check "$tmp/probe.json" 'r["dry_run"] and r["estimate"]["predicted_stun_ms"] > 0 and len(r["rounds"]) >= 1' "probe reports measured and predicted"
json_check "$tmp/probe.json" 'r["estimate"]["path_calibration"]["key"].startswith("insecure/")' "the probe estimates over its own path, calibrated"
json_check "$tmp/probe.json" 'r["estimate_at_probe_rate"]["round0_bytes_per_s"] > 0 and r["estimate_at_probe_rate"]["predicted_stun_ms"] > 0' "the probe's measured rate is fed back into the model"
json_check "$tmp/probe.recv.json" '"dry run" in r["error"]' "receiver says why it discarded"

# 9. A completed migration on a calibrated path joins the host's record of runs
# against their calibration (the estimator's ranges are drawn from it); the
# probe above, which did not complete, does not.
paths="$tmp/calibration-paths.json"
python3 -c "import json,sys; sys.exit(len(json.load(open(sys.argv[1])).get('observations', [])))" "$paths"
check "a probe is not recorded" 0 $?
start_receiver record "$dev"
timeout 120 "$bin" migrate --device "$dev" --to 127.0.0.1:$port --insecure-no-tls --json >"$tmp/record.json" 2>/dev/null
check "migrate on the calibrated path" 0 $?
wait $rpid; check "receive on the calibrated path" 0 $?
json_check "$paths" 'len(r["observations"]) == 1 and r["observations"][0]["key"] == "insecure/2/none/uncapped" and not r["observations"][0]["capped"] and r["observations"][0]["round0_ratio"] > 0 and r["observations"][0]["stun_ratio"] > 0' "the migration is recorded against its path"

if [ $fail -ne 0 ]; then echo "net_migration: FAILED"; exit 1; fi
echo "net_migration: all checks passed"
