#!/usr/bin/env bash
# The CLI contract automation depends on (docs/design.md): help, exit codes, JSON keys,
# progress on stderr. Usage: cli_contract_test.sh path/to/gpumigrate
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check NAME EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL: $1: exit code $3, expected $2"; fail=1; else echo "ok: $1"; fi
}
contains() {  # contains NAME FILE TEXT
  if grep -q -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1: '$3' not in output:"; cat "$2"; fail=1; fi
}

"$bin" --help >"$tmp/help" 2>&1; check "--help" 0 $?
contains "--help lists demo" "$tmp/help" "demo"
contains "--help lists exit codes" "$tmp/help" "3 outcome in doubt"
"$bin" help demo >"$tmp/hd" 2>&1; check "help demo" 0 $?
for opt in --device --streams --downtime-target --max-stun --max-rounds --bandwidth --verify --warmup --run-after --json; do
  contains "help demo describes $opt" "$tmp/hd" "$opt"
done
"$bin" help nosuch >"$tmp/hn" 2>&1; check "help of an unknown command" 2 $?
"$bin" >"$tmp/none" 2>&1; check "no command" 2 $?
"$bin" frobnicate >"$tmp/unk" 2>&1; check "an unknown command" 2 $?
contains "an unknown command is named" "$tmp/unk" "unknown command 'frobnicate'"
contains "an unknown command lists the real ones" "$tmp/unk" "demo, estimate, migrate, receive"
"$bin" demo --device bogus:1 >"$tmp/e1" 2>&1; check "non-sim device" 2 $?
contains "non-sim device message" "$tmp/e1" "needs a sim device"
"$bin" demo --device sim:colour=blue >"$tmp/e2" 2>&1; check "unknown spec key" 2 $?
contains "unknown spec key message" "$tmp/e2" "unknown key 'colour'"
"$bin" demo --bandwidth 5parsecs >"$tmp/e3" 2>&1; check "bad rate" 2 $?
"$bin" demo --downtime-target soon >"$tmp/e4" 2>&1; check "bad duration" 2 $?
"$bin" demo --verify maybe >"$tmp/e5" 2>&1; check "bad verify mode" 2 $?
"$bin" demo --codec lz4 >"$tmp/e8" 2>&1; check "unknown codec" 2 $?
contains "unknown codec message" "$tmp/e8" "is not one of none, zstd"

small="sim:size=48MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms"
"$bin" demo --json --device "$small" --warmup 50ms --run-after 100ms --bandwidth 400MB/s --downtime-target 20ms \
  >"$tmp/ok.json" 2>"$tmp/ok.err"
check "demo --json completes" 0 $?
contains "progress goes to stderr as plain lines" "$tmp/ok.err" "round 0"
python3 - "$tmp/ok.json" <<'PY' || fail=1
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
assert len(lines) == 1, f"stdout must hold exactly one JSON object, got {len(lines)} lines"
r = json.loads(lines[0])
for k in ["outcome", "verified", "stun_ms", "stun_breakdown_ms", "total_ms", "bytes_sent", "rounds", "predicted_stun_ms"]:
    assert k in r, f"missing key {k}"
assert r["outcome"] == "completed", r
assert r["verified"] is True
assert r["stun_ms"] > 0 and r["total_ms"] >= r["stun_ms"]
assert isinstance(r["stun_breakdown_ms"], dict) and "final_data" in r["stun_breakdown_ms"]
assert abs(sum(r["stun_breakdown_ms"].values()) - r["stun_ms"]) < 0.05 * r["stun_ms"] + 0.1, r
assert len(r["rounds"]) >= 2 and r["rounds"][-1]["final"] is True
for x in r["rounds"]:
    for k in ["round", "bytes", "dirty_bytes", "ms"]:
        assert k in x, f"round lacks {k}"
assert r["bytes_sent"] == sum(x["bytes"] for x in r["rounds"])
assert r["destination"]["self_check"] == "ok", r["destination"]
assert r["destination"]["kernels_run_after_resume"] > 0
print("ok: demo JSON follows the contract")
PY

# Compression where it pays: auto picks bf16 for the bf16 weights on a slow link (the best
# ratio and the least CPU: ChooseCodec), and says what it sampled.
"$bin" demo --json --device "$small" --warmup 10ms --run-after 10ms --bandwidth 100MB/s --codec auto \
  --downtime-target 50ms >"$tmp/codec.json" 2>/dev/null
check "demo --codec auto" 0 $?
python3 - "$tmp/codec.json" <<'PY' || fail=1
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["outcome"] == "completed" and r["verified"], r
codecs = {c["region"]: c["codec"] for c in r["codecs"]}
assert codecs["weights"] == "bf16", codecs
w = [c for c in r["codecs"] if c["region"] == "weights"][0]
assert w["sampled_bf16_ratio"] > w["sampled_shuffle_ratio"] > w["sampled_zstd_ratio"], w
assert codecs["free_pool"] == "none", codecs
assert r["compression_ratio"] > 1.2, r["compression_ratio"]
print("ok: auto codec compresses on a slow link")
PY
"$bin" demo --codec bf16:3 >"$tmp/e8b" 2>&1; check "bf16 with a level" 2 $?
contains "bf16 takes no level" "$tmp/e8b" "codec: bf16 takes no level"

# Dirty rate far above the capped link: aborted, drain-and-replace, exit 1.
"$bin" demo --json --device "sim:size=32MiB,hot=8MiB,kv_rate=0,page=16KiB,step=1ms" --warmup 10ms \
  --bandwidth 20MB/s --downtime-target 1ms --max-stun 10ms --max-rounds 3 >"$tmp/abort.json" 2>/dev/null
check "non-converging demo exits 1" 1 $?
python3 - "$tmp/abort.json" <<'PY' || fail=1
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["outcome"] == "aborted", r
assert "drain-and-replace" in r["error"], r["error"]
assert "RUNNING" in r["resolution"], r["resolution"]
print("ok: non-converging demo reports drain-and-replace")
PY

# A time budget the capped link cannot meet (64 MiB at 4 MB/s: 16 s; 6 s): aborted
# within round 0, not at its end, exit 1, the report saying which rule and why.
"$bin" demo --json --device "sim:size=64MiB,hot=1MiB,kv_rate=0,page=64KiB" --warmup 10ms \
  --bandwidth 4MB/s --max-total 6s >"$tmp/budget.json" 2>/dev/null
check "a demo over its time budget exits 1" 1 $?
python3 - "$tmp/budget.json" <<'PY' || fail=1
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["outcome"] == "aborted", r
assert "beyond max total 6 s" in r["error"] and "from now" in r["error"], r["error"]
assert r["stop_reason"] == "over budget" and r["drain_recommended"] is True, r
assert r["rounds"] == [], r["rounds"]
assert "RUNNING" in r["resolution"] and "time budget" in r["resolution"], r["resolution"]
print("ok: a demo over its time budget is aborted within round 0")
PY
"$bin" demo --max-total 0s >"$tmp/e_budget" 2>&1; check "a zero time budget" 2 $?
contains "a zero time budget is named" "$tmp/e_budget" "--max-total: must be more than zero"

# Human report.
"$bin" demo --device "$small" --warmup 10ms --run-after 50ms >"$tmp/human" 2>/dev/null
check "demo human report" 0 $?
contains "report shows the stun breakdown" "$tmp/human" "final_data"
contains "report shows the destination self-check" "$tmp/human" "self-check of activation canaries: ok"

# estimate: a dry run that only observes; calibration goes to a scratch file.
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
# The path calibration's runs (two processes of this binary) on a small device: the
# figures do not matter here, the time under sanitizers does.
export GPUMIGRATE_PATH_CALIBRATION_SIZE=24MiB
"$bin" help estimate >"$tmp/he" 2>&1; check "help estimate" 0 $?
for opt in --device --link --sample --max-stun --project --json --qemu --qemu-dirty-sample; do
  contains "help estimate describes $opt" "$tmp/he" "$opt"
done
"$bin" estimate --device "$small" --sample 300ms --warmup 50ms --link 1Gbit --json >"$tmp/est.json" 2>"$tmp/est.err"
check "estimate --json" 0 $?
contains "the first estimate of a path says it calibrates it" "$tmp/est.err" "calibrating the path tls/"
test -s "$tmp/calibration-paths.json" && echo "ok: path calibration stored beside the calibration" ||
  { echo "FAIL: no $tmp/calibration-paths.json"; fail=1; }
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --link 1Gbit --json >"$tmp/est2.json" 2>"$tmp/est2.err"
check "estimate again on the same path" 0 $?
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --link 1Gbit --transport in-process --json \
  >"$tmp/est3.json" 2>/dev/null
check "estimate --transport in-process" 0 $?
python3 - "$tmp/est.json" "$tmp/est2.json" "$tmp/est3.json" "$tmp/est2.err" <<'PY' || fail=1
import json, sys
first, again, inproc = (json.load(open(f)) for f in sys.argv[1:4])
pc = first["path_calibration"]
assert pc["key"].startswith("tls/") and pc["key"].endswith("/none/125000000B/s"), pc
assert pc["measured_now"] is True and pc["final_bytes_per_s"] > 0 and pc["fixed_ms"] >= 0, pc
assert again["path_calibration"]["measured_now"] is False, again["path_calibration"]
assert "calibrating the path" not in open(sys.argv[4]).read(), "the stored path calibration was not reused"
assert "path_calibration" not in inproc, inproc.keys()
print("ok: the path is calibrated once, reused, and skipped with --transport in-process")
PY
echo '{"version": 1, "paths": {"tls/2/none/125000000B/s": {"transport": 3}}' >"$tmp/calibration-paths.json"
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --link 1Gbit --json >"$tmp/est4.json" 2>"$tmp/est4.err"
check "estimate over a damaged path calibration" 0 $?
contains "a damaged path calibration is named and measured again" "$tmp/est4.err" "calibration-paths.json"
test -s "$GPUMIGRATE_CALIBRATION" && echo "ok: calibration stored" || { echo "FAIL: no calibration file"; fail=1; }
python3 - "$tmp/est.json" <<'PY' || fail=1
import json, sys
r = json.loads(open(sys.argv[1]).read())
for k in ["predicted_stun_ms", "predicted_stun_range_ms", "predicted_total_ms", "predicted_rounds", "decision",
          "stop_reason", "assumptions", "regions", "fixed_cost_ms"]:
    assert k in r, f"missing key {k}"
lo, hi = r["predicted_stun_range_ms"]
assert lo <= r["predicted_stun_ms"] <= hi, r
assert r["decision"] in ("live-migrate", "drain-and-replace", "cannot-converge")
# The slower of the link and this host's calibrated pipeline (slow under sanitizers).
bw = r["bandwidth_bytes_per_s"]
assert 0 < bw["mid"] <= 125e6 and "--link 1Gbit" in bw["source"], bw
assert any(x["name"] == "activations" and x["dirty_working_set"][-1]["mid_bytes"] > 0 for x in r["regions"])
print("ok: estimate JSON follows the contract")
PY
# A hot set rewritten faster than the link: cannot converge within the limit.
"$bin" estimate --device "sim:size=32MiB,hot=8MiB,kv_rate=0,page=16KiB,step=1ms" --sample 200ms --warmup 20ms \
  --link 20MB/s --max-stun 10ms --json >"$tmp/nc.json" 2>/dev/null
check "estimate of a non-converging workload" 0 $?
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['decision']=='cannot-converge', r['decision']; print('ok: cannot-converge')" "$tmp/nc.json" || fail=1
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --link 100Gbit --project 8x80GB >"$tmp/proj" 2>/dev/null
check "estimate --project" 0 $?
contains "projection states its assumptions" "$tmp/proj" "dirty working sets scale with size"
contains "projection names the size" "$tmp/proj" "596.05 GiB"
"$bin" estimate --project 8xlots >"$tmp/e6" 2>&1; check "bad projection" 2 $?
# Projection to a target: a host profile from `calibrate --profile-out`, read back with --target.
"$bin" calibrate --profile-out "$tmp/target.json" --json >"$tmp/cal.json" 2>/dev/null; check "calibrate --profile-out" 0 $?
python3 - "$tmp/cal.json" "$tmp/target.json" <<'PY' || fail=1
import json, sys
c = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
assert c["fixed_cost_ms"] >= 0 and c["host_profile"]["cores"] >= 1, c
for k in ("copy", "hash", "aes_gcm", "tcp", "zstd_compress", "zstd_decompress", "shuffle_compress", "shuffle_decompress",
          "bf16_compress", "bf16_decompress"):
    assert t["per_core_bytes_per_s"][k] > 0, k
print("ok: the host profile holds every stage's rate")
PY
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --project 80GB --project-per-gpu --target "$tmp/target.json" \
  --cores 32 --project-table --table-gpus 1,8 --table-links 25Gbit,400Gbit --plot "$tmp/p.svg" >"$tmp/tab" 2>/dev/null
check "estimate --project-table" 0 $?
contains "table names the published figure as not ours" "$tmp/tab" "published, not ours"
contains "table states the per-GPU assumption" "$tmp/tab" "8 GPUs dirty 8 times it"
contains "table states where the rates come from" "$tmp/tab" "from $tmp/target.json"
test "$(grep -c 'Gbit' "$tmp/tab")" -ge 4 && echo "ok: a row per GPU count and link" || { echo "FAIL: rows"; cat "$tmp/tab"; fail=1; }
grep -q "<svg" "$tmp/p.svg" && echo "ok: --plot draws an SVG" || { echo "FAIL: no SVG"; fail=1; }
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --project 8x80GB --kv-rate-per-gpu 200MB/s \
  --static-fraction 0.7 --cores 64 --link 100Gbit --json >"$tmp/kv.json" 2>/dev/null
check "estimate with explicit per-GPU figures" 0 $?
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert 'target_pipeline' in r and any('given, not measured' in a for a in r['assumptions']), r['assumptions']; print('ok: explicit workload and target pipeline in the JSON')" "$tmp/kv.json" || fail=1
# The pipeline as built: the workers migrate would run (--threads), integrity tags with --transport insecure.
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --project 80GB --target "$tmp/target.json" --cores 4 \
  --threads 3 --transport insecure --json >"$tmp/w.json" 2>/dev/null
check "estimate --threads" 0 $?
python3 - "$tmp/w.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
assert any("3 source workers (--threads" in a for a in r["assumptions"]), r["assumptions"]
limits = {l["name"]: l for l in r["target_pipeline"]["limits"]}
assert "3 reading threads on 4 cores" in limits["source workers"]["detail"], limits
assert "tag" in limits["source send"]["detail"] and "AES" not in limits["source send"]["detail"], limits
print("ok: the projection runs migrate's workers and tags without TLS")
PY
# The destination's workers (receive --threads): one stream's thread receives, two workers write.
"$bin" estimate --device "$small" --sample 200ms --warmup 10ms --project 80GB --target "$tmp/target.json" --cores 4 \
  --streams 1 --destination-threads 2 --json >"$tmp/dw.json" 2>/dev/null
check "estimate --destination-threads" 0 $?
python3 - "$tmp/dw.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
assert any("2 destination workers open and write" in a for a in r["assumptions"]), r["assumptions"]
limits = {l["name"]: l for l in r["target_pipeline"]["limits"]}
assert "2 writing threads on 4 cores" in limits["destination workers"]["detail"], limits
assert "1 receiving thread on 4 cores" in limits["destination receive"]["detail"], limits
print("ok: the projection runs receive's workers beside the stream's receiving thread")
PY
"$bin" receive --listen 127.0.0.1:0 --threads 65 >"$tmp/rt" 2>&1; check "receive --threads out of range" 2 $?
contains "receive --threads names the flag" "$tmp/rt" "--threads"
"$bin" estimate --project 80GB --target "$tmp/absent.json" >"$tmp/e6b" 2>&1; check "missing host profile" 2 $?
contains "missing host profile is named" "$tmp/e6b" "absent.json"
"$bin" estimate --project-table >"$tmp/e6c" 2>&1; check "table without a projection" 2 $?
"$bin" estimate --device proc:1 >"$tmp/e7" 2>&1; check "process without the shim" 2 $?
contains "proc message" "$tmp/e7" "serves no gpumigrate shim"
"$bin" estimate --device vfio:/dev/vfio/1 >"$tmp/e8" 2>&1; check "vfio device that is not there" 2 $?
contains "vfio message names the call and errno" "$tmp/e8" "vfio:/dev/vfio/1: open failed: No such file or directory (ENOENT)"
"$bin" estimate --device gpu:1 >"$tmp/e9" 2>&1; check "unknown backend" 2 $?
contains "unknown backend lists every spec" "$tmp/e9" "use sim:..., proc:PID, cuda:PID, vfio:PATH\[,PATH\.\.\.\] or shm:PATH"

# demo --dry-run: estimate, probe, abort on purpose, exit 0.
"$bin" demo --dry-run --json --device "$small" --sample 300ms --warmup 20ms --bandwidth 400MB/s \
  --downtime-target 20ms >"$tmp/probe.json" 2>/dev/null
check "demo --dry-run" 0 $?
python3 - "$tmp/probe.json" <<'PY' || fail=1
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["dry_run"] is True and r["outcome"] == "aborted", r
assert "error" not in r, r
assert r["estimate"]["predicted_stun_ms"] > 0 and r["predicted_stun_ms"] > 0
print("ok: dry run reports measured and predicted")
PY

if [ $fail -ne 0 ]; then echo "cli_contract: FAILED"; exit 1; fi
echo "cli_contract: all checks passed"
