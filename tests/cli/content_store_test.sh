#!/usr/bin/env bash
# Content-addressed pre-copy as a user runs it: `content-store add` seeds a
# directory with a model's weights (a sim's static region), then `receive
# --content-store` and `migrate` run as two processes over PSK TLS on loopback.
# The destination fills the weights from its store and the VM arrives byte for
# byte (digests at Prepare, the workload's self-check after resume); a store of
# another model fills nothing; --no-content-offer sends everything; a damaged
# index is rebuilt; a checkpoint leaves the weights to the store and a restore
# fills them from it. Every process is bounded by `timeout`; only 127.0.0.1.
# Usage: content_store_test.sh path/to/gpumigrate
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0
source "$(dirname "$0")/lib.sh"

dev="sim:size=48MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms"
other="sim:size=48MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms,seed=9"
openssl rand -hex 32 >"$tmp/psk"

# migrate_once NAME STORE [MIGRATE ARGS...]: receive with --content-store STORE, then migrate.
migrate_once() {
  local name=$1 store=$2; shift 2
  rm -f "$tmp/$name.port"
  timeout 120 "$bin" receive --listen 127.0.0.1:0 --port-file "$tmp/$name.port" --device "$dev" \
    --psk-file "$tmp/psk" --content-store "$store" --json --run-after 100ms \
    >"$tmp/$name.recv.json" 2>"$tmp/$name.recv.err" &
  local rpid=$!
  pids+=("$rpid")
  for _ in $(seq 100); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
  timeout 120 "$bin" migrate --device "$dev" --to "127.0.0.1:$(cat "$tmp/$name.port")" --psk-file "$tmp/psk" \
    --streams 2 --warmup 50ms --json "$@" >"$tmp/$name.json" 2>"$tmp/$name.err"
  check "$name: migrate" 0 $?
  wait $rpid; check "$name: receive" 0 $?
}

# 1. Seeding the store: the weights of the model, indexed.
mkdir "$tmp/store" "$tmp/other"
"$bin" content-store add "$tmp/store" --device "$dev" --page-size 16KiB --json >"$tmp/add.json" 2>"$tmp/add.err"
check "content-store add" 0 $?
json_check "$tmp/add.json" 'r["files"] == 1 and r["pages"] > 1500 and r["index_written"] and r["written"][0].endswith("sim.weights.raw")' \
  "the store holds the sim's weights, indexed by 16 KiB page"
"$bin" content-store add "$tmp/other" --device "$other" --page-size 16KiB >/dev/null 2>&1
check "content-store add (another model)" 0 $?

# 2. The weights are filled at the destination, not sent.
migrate_once held "$tmp/store"
json_check "$tmp/held.json" 'r["outcome"] == "completed" and r["verified"]' "held: completed and verified"
json_check "$tmp/held.recv.json" 'r["destination"]["self_check"] == "ok"' "held: the workload self-checks after resume"
weights=$(python3 -c "import json; print(json.load(open('$tmp/add.json'))['file_bytes'])")
json_check "$tmp/held.recv.json" "r['dedup_bytes'] >= 0.8 * $weights" "held: at least 80% of the weights filled from the store"
json_check "$tmp/held.json" "r['rounds'][0]['bytes'] < r['device_bytes'] - 0.5 * $weights" "held: the weights did not cross the link in round 0"
contains "held: the report says what the store filled" "$tmp/held.recv.json" '"dedup_pages"'

# 3. A store holding another model: nothing filled, every page still arrives.
migrate_once other "$tmp/other"
json_check "$tmp/other.json" 'r["outcome"] == "completed" and r["verified"] and r["dedup_bytes"] == 0' "other model: nothing filled, verified"
json_check "$tmp/other.json" 'r["offered_pages"] < r["device_bytes"] / 16384 / 3' "other model: the offer backed off after its probe"
json_check "$tmp/other.recv.json" 'r["destination"]["self_check"] == "ok"' "other model: the workload self-checks"

# 4. --no-content-offer: every page's bytes.
migrate_once nooffer "$tmp/store" --no-content-offer
json_check "$tmp/nooffer.json" 'r["outcome"] == "completed" and r["offered_pages"] == 0 and r["dedup_bytes"] == 0' \
  "--no-content-offer: nothing offered"

# 5. A damaged index is rebuilt, never trusted.
printf 'garbage' | dd of="$tmp/store/.gpumigrate-index-16384" bs=1 seek=100 conv=notrunc 2>/dev/null
"$bin" content-store index "$tmp/store" --page-size 16KiB >"$tmp/index.out" 2>"$tmp/index.err"
check "content-store index after damage" 0 $?
contains "a damaged index is rebuilt and says why" "$tmp/index.err" "was not used and was rebuilt: content index: checksum"
"$bin" content-store index "$tmp/store" --page-size 16KiB >"$tmp/index2.out" 2>&1
contains "the rebuilt index is used as it is" "$tmp/index2.out" "0 files hashed now"

# 6. The estimate knows what the destination holds (--content-store-hint): the
#    weights cost their digests in round 0, and the time to read and hash them.
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json" GPUMIGRATE_PATH_CALIBRATION_SIZE=24MiB
timeout 300 "$bin" estimate --device "$dev" --sample 300ms --warmup 50ms --json >"$tmp/est.json" 2>"$tmp/est.err"
check "estimate without a hint" 0 $?
timeout 300 "$bin" estimate --device "$dev" --sample 300ms --warmup 50ms --content-store-hint static --json \
  >"$tmp/esth.json" 2>"$tmp/esth.err"
check "estimate --content-store-hint static" 0 $?
json_check "$tmp/esth.json" 'r["regions"][0]["name"] == "weights" and r["regions"][0]["held_fraction"] == 1 and r["offer_bytes_per_s"] > 0' \
  "the hint holds the weights and the offer's rate was measured"
json_check "$tmp/esth.json" 'any("content store holds 100% of region weights" in a for a in r["assumptions"])' \
  "the estimate says what it assumed"
"$bin" estimate --device "$dev" --content-store-hint nosuch >"$tmp/esth2.err" 2>&1; check "a hint naming no region" 2 $?
contains "the hint's error names the regions" "$tmp/esth2.err" "no region 'nosuch' (the regions: weights, kv_cache"
"$bin" estimate --device "$dev" --content-store-hint weights=2 >"$tmp/esth3.err" 2>&1; check "a share above 1" 2 $?

# 7. checkpoint --content-store: the weights stay out of the file; restore and
#    verify need the store, fill from it, and the restored workload self-checks.
timeout 120 "$bin" checkpoint --device "$dev" --to "$tmp/c.ckpt" --warmup 50ms --bandwidth 200MB/s \
  --content-store "$tmp/store" --json >"$tmp/c.json" 2>"$tmp/c.err"
check "checkpoint --content-store" 0 $?
json_check "$tmp/c.json" "r['outcome'] == 'completed' and r['dedup_bytes'] >= 0.8 * $weights and r['rounds'][0]['bytes'] < r['device_bytes'] - 0.5 * $weights" \
  "checkpoint --content-store: the weights are not in the file (round 0 wrote the rest)"
timeout 60 "$bin" checkpoint info "$tmp/c.ckpt" >"$tmp/cinfo.out" 2>&1
contains "checkpoint info names the store" "$tmp/cinfo.out" "pages left to the content store $tmp/store"
timeout 60 "$bin" checkpoint verify "$tmp/c.ckpt" >"$tmp/cv1.out" 2>&1; check "verify without the store" 2 $?
contains "verify without the store says to give it" "$tmp/cv1.out" "restore it with --content-store"
timeout 60 "$bin" checkpoint verify "$tmp/c.ckpt" --content-store "$tmp/store" >"$tmp/cv2.out" 2>&1
check "verify with the store" 0 $?
timeout 60 "$bin" restore --from "$tmp/c.ckpt" --device "$dev" --run-after 100ms >"$tmp/cr1.out" 2>&1
check "restore without the store" 2 $?
timeout 60 "$bin" restore --from "$tmp/c.ckpt" --device "$dev" --content-store "$tmp/store" --run-after 100ms --json \
  >"$tmp/cr2.json" 2>"$tmp/cr2.err"
check "restore --content-store" 0 $?
json_check "$tmp/cr2.json" "r['outcome'] == 'completed' and r['verified'] and r['dedup_bytes'] >= 0.8 * $weights and r['destination']['self_check'] == 'ok'" \
  "restore --content-store: filled from the store, verified, the workload self-checks"
timeout 60 "$bin" restore --from "$tmp/c.ckpt" --device "$dev" --content-store "$tmp/other" >"$tmp/cr3.out" 2>&1
check "restore with another model's store" 1 $?
contains "a store without the file's pages is named" "$tmp/cr3.out" "does not hold page"

# 8. Usage errors.
"$bin" content-store index "$tmp/nonexistent" >"$tmp/u1.err" 2>&1; check "index of a missing directory" 2 $?
"$bin" content-store index "$tmp/store" --page-size 1000 >"$tmp/u2.err" 2>&1; check "a page size that is no power of two" 2 $?
contains "the page size error says why" "$tmp/u2.err" "power of two"

exit $fail
