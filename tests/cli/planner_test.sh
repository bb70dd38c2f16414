#!/usr/bin/env bash
# `gpumigrate plan` and `gpumigrate inventory` as automation sees them: exit codes
# (0 can evacuate, 1 cannot, 2 malformed naming the key), JSON on stdout only,
# the table and timeline for people, --plot. Usage: planner_test.sh path/to/gpumigrate
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
data=$here/../data/planner
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$here/lib.sh"

"$bin" help plan >"$tmp/help" 2>&1; check "help plan" 0 $?
for opt in --inventory --evacuate --json --allow-power-off --plot; do contains "help plan describes $opt" "$tmp/help" "$opt"; done

# A UVM VM without power-off: exit 1, the plan still printed with the reason.
"$bin" plan --inventory "$data/example.json" --evacuate gpu-a >"$tmp/t1" 2>"$tmp/e1"; check "blocked plan exits 1" 1 $?
contains "table has a header" "$tmp/t1" "VM .*ACTION .*TARGET .*STUN .*START .*END .*REASON"
contains "table explains the blocked VM" "$tmp/t1" "train-1 .*blocked .*Unified Virtual Memory"
contains "a timeline follows" "$tmp/t1" "timeline, 0 to"
"$bin" plan --inventory "$data/example.json" --evacuate gpu-a --json >"$tmp/j1" 2>"$tmp/e1"; check "blocked --json exits 1" 1 $?
json_check "$tmp/j1" 'r["feasible"] is False and "train-1" in r["reason"] and len(r["actions"]) == 4' "blocked plan JSON"

# With power-off allowed: exit 0, exactly the plan format on stdout.
"$bin" plan --inventory "$data/example.json" --evacuate gpu-a --json --allow-power-off >"$tmp/j2" 2>"$tmp/e2"
check "feasible plan exits 0" 0 $?
json_check "$tmp/j2" 'r["version"] == 1 and r["host"] == "gpu-a" and r["feasible"] is True and r["reason"] == ""' "plan keys"
json_check "$tmp/j2" 'r["total_ms"] <= r["batched_total_ms"] and all(set(["vm","action","to","predicted_stun_ms","start_ms","end_ms","reason"]) <= set(a) for a in r["actions"])' "action keys"
json_check "$tmp/j2" '{a["vm"]: a["action"] for a in r["actions"]} == {"llm-1": "live-migrate", "chat-1": "drain-and-replace", "desk-1": "live-migrate", "train-1": "power-off"}' "decisions"
cmp -s "$tmp/j2" "$data/example.power-off.plan.json"; check "--json output is the golden plan" 0 $?

# Capacity refusal: exit 1, the reason names the shortfall.
"$bin" plan --inventory "$data/capacity.json" --evacuate gpu-a --json >"$tmp/j3" 2>/dev/null; check "capacity refusal exits 1" 1 $?
json_check "$tmp/j3" '"capacity shortfall" in r["reason"]' "capacity reason"

# Link-aware placement (review case i13): the VM whose stun fits only the fast
# target gets it whichever order the inventory lists the VMs in; exit 0 both ways.
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["vms"].reverse(); print(json.dumps(j))' \
  "$data/linkplace.json" >"$tmp/linkplace-rev.json"
for inv in "$data/linkplace.json" "$tmp/linkplace-rev.json"; do
  "$bin" plan --inventory "$inv" --evacuate src --json >"$tmp/j6" 2>/dev/null; check "link placement exits 0 ($(basename "$inv"))" 0 $?
  json_check "$tmp/j6" '{a["vm"]: a["to"]["host"] for a in r["actions"]} == {"easy": "slow", "hard": "fast"}' "hard VM on the fast target"
done

# Usage and malformed inventories: exit 2 with the key path.
"$bin" plan --inventory "$data/example.json" --evacuate gpu-z >/dev/null 2>"$tmp/e4"; check "unknown host exits 2" 2 $?
contains "unknown host named" "$tmp/e4" "no host 'gpu-z'"
"$bin" plan --inventory "$tmp/none.json" --evacuate gpu-a >/dev/null 2>"$tmp/e5"; check "missing file exits 2" 2 $?
damage() {  # damage NAME PYTHON-STATEMENT-ON-j EXPECTED-KEY-PATH
  python3 - "$data/example.json" "$tmp/bad.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(j, open(sys.argv[2], "w"))
PY
  "$bin" plan --inventory "$tmp/bad.json" --evacuate gpu-a --json >"$tmp/bad.out" 2>"$tmp/bad.err"
  check "$1 exits 2" 2 $?
  contains "$1 names $3" "$tmp/bad.err" "$3"
  [ -s "$tmp/bad.out" ] && { echo "FAIL: $1 printed on stdout"; fail=1; }
}
damage "overlapping MIG placement" 'j["vms"][1]["placement"] = 4' 'vms\[1\]\.placement: .*overlap'
damage "invalid start slice" 'j["vms"][0]["placement"] = 5' 'vms\[0\]\.placement: slot 5 is not a valid start for 3g.40gb'
damage "VM on an unknown host" 'j["vms"][2]["host"] = "gpu-q"' "vms\[2\]\.host: unknown host 'gpu-q'"
damage "VM on an unknown GPU" 'j["vms"][3]["gpus"] = [9]' 'vms\[3\]\.gpus\[0\]: host gpu-a has no GPU 9'
damage "profile its mode cannot hold" 'j["vms"][3]["profile"] = "2g.20gb"; j["vms"][3]["placement"] = 0' 'vms\[3\]\.profile: .*needs a mig GPU'
damage "unknown model" 'j["hosts"][1]["gpus"][0]["model"] = "B200"' 'hosts\[1\]\.gpus\[0\]\.model: unknown GPU model'
damage "negative size" 'j["vms"][3]["profile"] = "vgpu:-8GB"' 'vms\[3\]\.profile'
damage "negative stun" 'j["vms"][0]["estimate"]["predicted_stun_ms"] = -1' 'vms\[0\]\.estimate\.predicted_stun_ms'
printf '{"version": 1, "hosts": [' >"$tmp/trunc.json"
"$bin" plan --inventory "$tmp/trunc.json" --evacuate gpu-a >/dev/null 2>"$tmp/e6"; check "truncated JSON exits 2" 2 $?
contains "truncated JSON says so" "$tmp/e6" "not JSON"

# inventory --from-estimates: estimates attached by VM name, the result plans.
mkdir -p "$tmp/est"
python3 - "$data/example.json" "$tmp/base.json" "$data/profile.json" "$tmp/est/llm-1.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for vm in j["vms"]:
    vm.pop("estimate", None)
json.dump(j, open(sys.argv[2], "w"))
profiled = json.load(open(sys.argv[3]))["vms"][0]["estimate"]
profiled["link"] = "100Gbit"
json.dump(profiled, open(sys.argv[4], "w"))
PY
"$bin" inventory --base "$tmp/base.json" --from-estimates "$tmp/est" >"$tmp/merged.json" 2>"$tmp/e7"
check "inventory --from-estimates" 0 $?
contains "says what it attached" "$tmp/e7" "attached 1 estimate"
json_check "$tmp/merged.json" '[v for v in r["vms"] if v["name"] == "llm-1"][0]["estimate"]["regions"]' "estimate attached whole"
"$bin" plan --inventory "$tmp/merged.json" --evacuate gpu-a --json --allow-power-off >"$tmp/j8" 2>/dev/null
check "merged inventory plans" 0 $?
json_check "$tmp/j8" '[a for a in r["actions"] if a["vm"] == "llm-1"][0]["stun_basis"] == "profile"' "the profile is used"
# The real thing: a fresh `estimate --json` (a small sim device projected to the
# VM's 40 GB) is accepted whole and re-run at the share the schedule gives.
"$bin" estimate --json --device "sim:size=64MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms" --sample 200ms \
  --warmup 50ms --link 100Gbit --project 40GB >"$tmp/est/llm-1.json" 2>"$tmp/e7b"
check "estimate --json for the inventory" 0 $?
json_check "$tmp/est/llm-1.json" 'r["link"] == "100Gbit" and r["pipeline_bytes_per_s"] > 0 and r["regions"]' "estimate carries link and profile"
"$bin" inventory --base "$tmp/base.json" --from-estimates "$tmp/est" --out "$tmp/merged2.json" 2>/dev/null
check "inventory --out" 0 $?
"$bin" plan --inventory "$tmp/merged2.json" --evacuate gpu-a --json --allow-power-off >"$tmp/j9" 2>/dev/null
check "plan from a fresh estimate" 0 $?
json_check "$tmp/j9" '[a for a in r["actions"] if a["vm"] == "llm-1"][0]["stun_basis"] == "profile"' "fresh profile re-run"
echo '{"predicted_stun_ms": 1}' >"$tmp/est/llm-1.json"
"$bin" inventory --base "$tmp/base.json" --from-estimates "$tmp/est" >/dev/null 2>"$tmp/e9"; check "bad estimate exits 2" 2 $?
contains "bad estimate names the key" "$tmp/e9" 'vms\[0\]\.estimate\.link: missing'
echo '{}' >"$tmp/est/nobody.json"
"$bin" inventory --base "$tmp/base.json" --from-estimates "$tmp/est" >/dev/null 2>"$tmp/e10"; check "estimate of no VM exits 2" 2 $?

# --plot: a PNG with gnuplot, a clear error without it.
if command -v gnuplot >/dev/null; then
  "$bin" plan --inventory "$data/example.json" --evacuate gpu-a --allow-power-off --plot "$tmp/t.png" >/dev/null 2>&1
  check "--plot" 0 $?
  [ -s "$tmp/t.png" ] && echo "ok: --plot wrote a PNG" || { echo "FAIL: no PNG"; fail=1; }
else
  "$bin" plan --inventory "$data/example.json" --evacuate gpu-a --plot "$tmp/t.png" >/dev/null 2>"$tmp/e11"
  check "--plot without gnuplot exits 2" 2 $?
  contains "--plot without gnuplot says so" "$tmp/e11" "needs gnuplot"
fi
exit $fail
