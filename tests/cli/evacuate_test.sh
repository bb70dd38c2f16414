#!/usr/bin/env bash
# `gpumigrate evacuate` against three real agents on loopback (gpu-a is
# evacuated to gpu-b and gpu-c): a plan refused when no target can take the
# load, nothing moved; a plan made now and not confirmed, nothing moved; then
# the controller SIGKILLed mid-evacuation and started again with the same --id:
# it continues from its journal, every VM leaves gpu-a exactly once (one
# migrate job each), every migrated VM verified at its target, the replica
# group's replacement started before its old replica drained; then a target
# agent killed mid-migration: that VM stays running on its source and is
# re-planned onto the other target; then scripts/maintenance-mode on that
# fleet: status, enter --dry-run (nothing changes), enter (empty, in
# maintenance), exit, and an enter refused (nowhere to go) changing nothing.
# Usage: evacuate_test.sh gpumigrate
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for j in "$tmp"/*/state.json; do
    [ -f "$j" ] && python3 -c "import json,sys,os,signal
for j in json.load(open(sys.argv[1]))['jobs']:
    try: os.killpg(j['pid'], signal.SIGKILL)
    except Exception: pass" "$j"
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
source "$here/lib.sh"

"$here/../../scripts/make-test-certs" "$tmp/pki" 127.0.0.1 2>/dev/null
tls=(--tls-ca "$tmp/pki/ca.pem" --tls-cert "$tmp/pki/source.pem" --tls-key "$tmp/pki/source.key")
dev='sim:size=24MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s'

host_config() {  # host_config NAME VMS-JSON
  cat >"$tmp/$1.json" <<EOF
{ "version": 1,
  "host": { "name": "$1", "link": "10Gbit", "max_migrations": 2,
            "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] },
  "groups": [ { "name": "chat", "min_serving": 1, "replica_start": "1s", "drain": "1s",
                "hooks": { "start_replica": ["sh", "-c", "echo start \$0 \$1 >> $tmp/hooks.log", "{vm}", "{host}"],
                           "drain": ["sh", "-c", "echo drain \$0 \$1 >> $tmp/hooks.log", "{vm}", "{host}"] } } ],
  "vms": $2 }
EOF
}
host_config gpu-a "[
  { \"name\": \"llm-1\", \"device\": \"$dev\", \"gpus\": [0], \"profile\": \"3g.40gb\", \"placement\": 0, \"class\": \"inference\" },
  { \"name\": \"llm-2\", \"device\": \"$dev\", \"gpus\": [0], \"profile\": \"1g.10gb\", \"placement\": 4, \"class\": \"inference\" },
  { \"name\": \"chat-1\", \"device\": \"$dev\", \"gpus\": [0], \"profile\": \"1g.10gb\", \"placement\": 5,
    \"class\": \"stateless-inference\", \"group\": \"chat\", \"max_stun\": \"1s\" } ]"
host_config gpu-b "[]"
host_config gpu-c "[
  { \"name\": \"chat-2\", \"device\": \"$dev\", \"gpus\": [0], \"profile\": \"1g.10gb\", \"placement\": 6,
    \"class\": \"stateless-inference\", \"group\": \"chat\" } ]"

start_agent() {  # start_agent NAME: sets port_NAME (dash as underscore) and pid_NAME
  local name=$1 v=${1//-/_}
  rm -f "$tmp/$name.port"
  "$bin" agent --config "$tmp/$name.json" --listen 127.0.0.1:0 --port-file "$tmp/$name.port" \
    --state-dir "$tmp/$name" "${tls[@]}" 2>>"$tmp/$name.log" &
  local p=$!
  pids+=("$p")
  for _ in $(seq 200); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
  eval "pid_$v=$p; port_$v=$(cat "$tmp/$name.port" 2>/dev/null)"
}
start_agent gpu-a
start_agent gpu-b
start_agent gpu-c
write_inventory() {
  cat >"$tmp/inventory.json" <<EOF
{ "version": 1, "policy": { "max_stun": "100s" },
  "hosts": [
    { "name": "gpu-a", "link": "10Gbit", "max_migrations": 2, "agent": "127.0.0.1:$port_gpu_a",
      "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] },
    { "name": "gpu-b", "link": "10Gbit", "max_migrations": 2, "agent": "127.0.0.1:$port_gpu_b",
      "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] },
    { "name": "gpu-c", "link": "10Gbit", "max_migrations": 2, "agent": "127.0.0.1:$port_gpu_c",
      "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] } ],
  "groups": [ { "name": "chat", "min_serving": 1, "replica_start": "1s", "drain": "1s" } ],
  "vms": [] }
EOF
}
write_inventory

call() {  # call HOST-PORT OP [BODY]
  timeout 60 "$bin" agent-call --agent "127.0.0.1:$1" "${tls[@]}" "$2" "${3:-{\}}" >"$tmp/reply.json" 2>"$tmp/reply.err"
}
vms_on() {  # vms_on PORT: the VM names an agent reports, sorted, space-separated ("?" when it does not answer)
  call "$1" inventory || { echo "?"; return 1; }
  python3 -c "import json,sys; print(' '.join(sorted(v['name'] for v in json.load(open(sys.argv[1]))['vms'])))" "$tmp/reply.json"
}
evacuate() {  # evacuate ARGS...: output in $tmp/evac.out/.err
  timeout 240 "$bin" evacuate --inventory "$tmp/inventory.json" --host gpu-a --store "$tmp/store" "${tls[@]}" \
    --poll 100ms "$@" >"$tmp/evac.out" 2>"$tmp/evac.err"
}

# 1. No target can take the load: refused, nothing moved.
call "$port_gpu_b" maintenance '{"enter": true}'
call "$port_gpu_c" maintenance '{"enter": true}'
evacuate --yes --id infeasible --events "$tmp/events.jsonl"
check "an infeasible evacuation is refused" 1 $?
contains "saying why" "$tmp/evac.err" "refused:"
python3 -c "import json,sys
ev = [json.loads(l) for l in open(sys.argv[1])]
assert [e['event'] for e in ev] == ['refused', 'done'], ev
assert ev[0]['v'] == 1 and ev[0]['reason'] and ev[1]['exit'] == 1 and ev[1]['evacuation'] == 'infeasible', ev" \
  "$tmp/events.jsonl" && echo "ok: its events say refused, then done with exit 1" || { echo "FAIL: events"; cat "$tmp/events.jsonl"; fail=1; }
evacuate --yes --id infeasible --events - --json
check "--events - with --json is a usage error" 2 $?
contains "saying why" "$tmp/evac.err" "both want stdout"
evacuate --yes --id infeasible --events /nonexistent/dir/events
check "an events file that cannot be opened is a usage error" 2 $?
contains "naming it" "$tmp/evac.err" "/nonexistent/dir/events"
[ "$(vms_on "$port_gpu_a")" = "chat-1 llm-1 llm-2" ] && echo "ok: nothing moved" || { echo "FAIL: gpu-a now holds $(vms_on "$port_gpu_a")"; fail=1; }
call "$port_gpu_b" maintenance '{"enter": false}'
call "$port_gpu_c" maintenance '{"enter": false}'

# 2. A plan made now is shown and must be confirmed: without --yes and without a terminal, nothing moves.
evacuate --id unconfirmed </dev/null
check "an unconfirmed evacuation does nothing" 1 $?
contains "it printed the plan first" "$tmp/evac.out" "live-migrate"
contains "it says it was not confirmed" "$tmp/evac.err" "not confirmed"
[ "$(vms_on "$port_gpu_a")" = "chat-1 llm-1 llm-2" ] && echo "ok: nothing moved" || { echo "FAIL: gpu-a now holds $(vms_on "$port_gpu_a")"; fail=1; }

# 3. The controller SIGKILLed once its first migrations run, then started again.
timeout 240 "$bin" evacuate --inventory "$tmp/inventory.json" --host gpu-a --store "$tmp/store" "${tls[@]}" \
  --poll 100ms --yes --id evac-1 --bandwidth 5MB/s >"$tmp/evac1.out" 2>"$tmp/evac1.err" &
cpid=$!
pids+=("$cpid")
# Killed once two migrations run (not mid-request: that is a case of its own).
for _ in $(seq 600); do [ "$(grep -c "live-migrate to gpu-. started" "$tmp/evac1.err")" -ge 2 ] && break; sleep 0.05; done
sleep 0.3
kill -9 "$cpid"; wait "$cpid" 2>/dev/null
contains "the first controller had started migrations" "$tmp/evac1.err" "live-migrate to gpu-. started"
evacuate --yes --id evac-1 --json
rc=$?
check "the restarted controller completes the evacuation" 0 $rc
[ $rc != 0 ] && { tail -20 "$tmp/evac.err"; }
contains "it continued from the journal" "$tmp/evac.err" "continuing evacuation evac-1 from its journal"
if grep -qE "still under way .*following it|found at its target after a controller restart" "$tmp/evac.err"; then
  echo "ok: it asked the agents about the migrations the journal says were started"
else
  echo "FAIL: no started migration was followed or found:"; grep -v "^ *$" "$tmp/evac.err" | head -20; fail=1
fi
[ -z "$(vms_on "$port_gpu_a")" ] && echo "ok: gpu-a is empty" || { echo "FAIL: gpu-a still holds $(vms_on "$port_gpu_a")"; fail=1; }
all="$(vms_on "$port_gpu_b") $(vms_on "$port_gpu_c")"
for v in llm-1 llm-2; do
  [[ " $all " == *" $v "* ]] && echo "ok: $v runs on a target" || { echo "FAIL: $v is on no target ($all)"; fail=1; }
done
python3 - "$tmp" <<'PY' || fail=1
import json, sys
tmp = sys.argv[1]
jobs = {h: json.load(open(f"{tmp}/{h}/state.json"))["jobs"] for h in ("gpu-a", "gpu-b", "gpu-c")}
ok = True
for vm in ("llm-1", "llm-2"):
    migrates = [j for j in jobs["gpu-a"] if j["kind"] == "migrate" and j["vm"] == vm]
    if len(migrates) != 1 or migrates[0]["state"] != "completed":
        print(f"FAIL: {vm}: migrate jobs on gpu-a: {[(j['id'], j['state']) for j in migrates]}"); ok = False
    recv = [j for h in ("gpu-b", "gpu-c") for j in jobs[h] if j["kind"] == "receive" and j["vm"] == vm and j["state"] == "completed"]
    if len(recv) != 1 or not recv[0].get("report", {}).get("verified"):
        print(f"FAIL: {vm}: verified receives: {len(recv)}"); ok = False
if ok:
    print("ok: each VM migrated exactly once, and verified at its target")
sys.exit(0 if ok else 1)
PY
json_check "$tmp/evac.out" 'r["exit_code"] == 0 and all(v["outcome"] == "completed" for v in r["vms"]) and len(r["vms"]) == 3' \
  "the report lists three completed VMs"
json_check "$tmp/evac.out" '[v for v in r["vms"] if v["vm"] == "chat-1"][0]["action"] == "drain-and-replace"' \
  "chat-1 (max stun 1 s, stateless, in a group) was drained and replaced"
if [ "$(head -1 "$tmp/hooks.log" | cut -d' ' -f1-2)" = "start chat-1-replica" ] && grep -q "^drain chat-1 gpu-a" "$tmp/hooks.log"; then
  echo "ok: chat-1's replacement started before chat-1 drained"
else
  echo "FAIL: hook order:"; cat "$tmp/hooks.log"; fail=1
fi
[[ " $all " == *" chat-1-replica "* ]] && echo "ok: the replacement runs on a target" || { echo "FAIL: no chat-1-replica ($all)"; fail=1; }

# 4. A target agent killed mid-migration: the VM stays on its source, re-planned elsewhere.
host_config gpu-d "[
  { \"name\": \"llm-9\", \"device\": \"$dev\", \"gpus\": [0], \"profile\": \"3g.40gb\", \"placement\": 0, \"class\": \"inference\" } ]"
start_agent gpu-d
python3 - "$tmp/inventory.json" "$port_gpu_d" <<'PY'
import json, sys
inv = json.load(open(sys.argv[1]))
inv["hosts"].append({"name": "gpu-d", "link": "10Gbit", "max_migrations": 2, "agent": "127.0.0.1:" + sys.argv[2],
                     "gpus": [{"index": 0, "model": "H100-80GB", "mode": "mig"}]})
json.dump(inv, open(sys.argv[1], "w"))
PY
# gpu-a is empty now, and gpu-b or gpu-c has a free 3g.40gb start too: two targets.
timeout 240 "$bin" evacuate --inventory "$tmp/inventory.json" --host gpu-d --store "$tmp/store" "${tls[@]}" \
  --poll 100ms --yes --id evac-d --bandwidth 3MB/s --resume-window 2s >"$tmp/evacd.out" 2>"$tmp/evacd.err" &
cpid=$!
pids+=("$cpid")
for _ in $(seq 300); do grep -q "llm-9: live-migrate to gpu-. started" "$tmp/evacd.err" && break; sleep 0.05; done
first=$(grep -o "llm-9: live-migrate to gpu-. started" "$tmp/evacd.err" | head -1 | grep -o "gpu-.")
sleep 1
case "$first" in
  gpu-a) kill -9 "$pid_gpu_a" ;;
  gpu-b) kill -9 "$pid_gpu_b" ;;
  gpu-c) kill -9 "$pid_gpu_c" ;;
  *) echo "FAIL: llm-9's migration did not start"; cat "$tmp/evacd.err"; fail=1 ;;
esac
# Its receiving child dies with it: the source rolls back.
python3 -c "import json,os,signal,sys
for j in json.load(open(sys.argv[1]))['jobs']:
    if j['state'] == 'running':
        try: os.killpg(j['pid'], signal.SIGKILL)
        except Exception: pass" "$tmp/$first/state.json" 2>/dev/null
wait "$cpid"
rc=$?
check "the evacuation completes on the other target" 0 $rc
contains "the failure was re-planned" "$tmp/evacd.err" "re-planned the VMs left after: llm-9 failed"
second=$(grep -o "llm-9: live-migrate to gpu-. started" "$tmp/evacd.err" | sed -n 2p | grep -o "gpu-.")
[ -n "$second" ] && [ "$second" != "$first" ] && echo "ok: llm-9 went to $second after $first died" || {
  echo "FAIL: second target '$second' (first $first)"; tail -20 "$tmp/evacd.err"; fail=1; }
[ -z "$(vms_on "$port_gpu_d")" ] && echo "ok: gpu-d is empty" || { echo "FAIL: gpu-d holds $(vms_on "$port_gpu_d")"; fail=1; }

# 5. scripts/maintenance-mode on the same fleet (one agent now dead): on the
# host llm-9 went to. --dry-run changes nothing; enter empties it into
# maintenance; status says so; exit returns it; an infeasible enter refuses.
mm() { GPUMIGRATE=$bin timeout 240 "$here/../../scripts/maintenance-mode" "$@" --inventory "$tmp/inventory.json" "${tls[@]}"; }
mhost=$second
mport_var=port_${mhost//-/_}
mport=${!mport_var}
before=$(vms_on "$mport")
mm status "$mhost" >"$tmp/mm.out" 2>&1; check "status of a host in the pool" 1 $?
contains "status names its state" "$tmp/mm.out" "$mhost: in the pool"
mm enter "$mhost" --dry-run >"$tmp/mm.out" 2>&1; check "enter --dry-run of a feasible evacuation" 0 $?
contains "it prints the plan" "$tmp/mm.out" "live-migrate"
[ "$(vms_on "$mport")" = "$before" ] && echo "ok: --dry-run moved nothing" || { echo "FAIL: --dry-run moved VMs"; fail=1; }
call "$mport" inventory
json_check "$tmp/reply.json" 'r["host"]["maintenance"] is False' "--dry-run left it in the pool"
mm enter "$mhost" --store "$tmp/store" --bandwidth 20MB/s >"$tmp/mm.out" 2>&1; rc=$?
check "enter evacuates the host into maintenance" 0 $rc
[ $rc != 0 ] && tail -20 "$tmp/mm.out"
mm status "$mhost" >"$tmp/mm.out" 2>&1; check "status: in maintenance and empty" 0 $?
contains "saying so" "$tmp/mm.out" "$mhost: in maintenance, 0 VMs"
mm exit "$mhost" >"$tmp/mm.out" 2>&1; check "exit returns the host to the pool" 0 $?
call "$mport" inventory
json_check "$tmp/reply.json" 'r["host"]["maintenance"] is False' "it takes VMs again"
# An occupied host whose VMs can go nowhere (every other live host in
# maintenance): enter refuses and changes nothing.
live=()
for h in gpu-a gpu-b gpu-c gpu-d; do
  [ "$h" != "$first" ] && live+=("$h")
done
ohost=""
for h in "${live[@]}"; do
  v=port_${h//-/_}
  [ -z "$ohost" ] && [ -n "$(vms_on "${!v}")" ] && ohost=$h
done
v=port_${ohost//-/_}
oport=${!v}
for h in "${live[@]}"; do
  v=port_${h//-/_}
  [ "$h" != "$ohost" ] && call "${!v}" maintenance '{"enter": true}'
done
if [ -n "$(vms_on "$oport")" ]; then
  before=$(vms_on "$oport")
  mm enter "$ohost" --store "$tmp/store" >"$tmp/mm.out" 2>&1; check "an infeasible enter is refused" 1 $?
  contains "saying nothing was changed" "$tmp/mm.out" "nothing was changed"
  call "$oport" inventory
  json_check "$tmp/reply.json" 'r["host"]["maintenance"] is False' "the refused host is still in the pool"
  [ "$(vms_on "$oport")" = "$before" ] && echo "ok: nothing moved" || { echo "FAIL: VMs moved"; fail=1; }
else
  echo "FAIL: $ohost holds no VM to test an infeasible enter with"; fail=1
fi

exit $fail
