#!/usr/bin/env bash
# `gpumigrate agent` and `agent-call` on loopback, two agents (gpu-a, gpu-b) with
# certificates from one CA: a sim VM moved from gpu-a to gpu-b over mutual TLS
# and verified there, each inventory updated; a controller whose certificate
# another CA signed refused by both; max_migrations and maintenance refusals;
# gpu-a SIGKILLed mid-migration and restarted: the migration it left running is
# found and completes; gpu-a SIGKILLed with its migrating child killed too: the
# restarted agent holds the source, never starts it again, until resolved.
# Usage: agent_test.sh gpumigrate
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; for j in "$tmp"/*/state.json; do
        [ -f "$j" ] && python3 -c "import json,sys,os,signal
for j in json.load(open(sys.argv[1]))[\"jobs\"]:
    try: os.killpg(j[\"pid\"], signal.SIGKILL)
    except Exception: pass" "$j"; done; rm -rf "$tmp"' EXIT
fail=0
source "$here/lib.sh"

"$here/../../scripts/make-test-certs" "$tmp/pki" 127.0.0.1 2>/dev/null
"$here/../../scripts/make-test-certs" "$tmp/foreign" 127.0.0.1 2>/dev/null
ctl=(--tls-ca "$tmp/pki/ca.pem" --tls-cert "$tmp/pki/source.pem" --tls-key "$tmp/pki/source.key")

cat >"$tmp/a.json" <<'EOF'
{ "version": 1,
  "host": { "name": "gpu-a", "link": "10Gbit", "max_migrations": 2,
            "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] },
  "groups": [ { "name": "chat", "min_serving": 1, "replica_start": "2s" } ],
  "vms": [
    { "name": "llm-1", "device": "sim:size=24MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s", "gpus": [0], "profile": "3g.40gb",
      "placement": 0, "class": "inference" },
    { "name": "chat-1", "device": "sim:size=24MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s", "gpus": [0], "profile": "1g.10gb",
      "placement": 4, "class": "stateless-inference", "group": "chat" } ] }
EOF
cat >"$tmp/b.json" <<'EOF'
{ "version": 1,
  "host": { "name": "gpu-b", "link": "10Gbit", "max_migrations": 1,
            "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] },
  "groups": [ { "name": "chat", "min_serving": 1, "replica_start": "2s" } ],
  "vms": [] }
EOF

start_agent() {  # start_agent NAME CERT: sets ${NAME}_pid and ${NAME}_addr
  local name=$1 cert=$2
  rm -f "$tmp/$name.port"
  "$bin" agent --config "$tmp/$name.json" --listen 127.0.0.1:0 --port-file "$tmp/$name.port" \
    --state-dir "$tmp/$name" --tls-ca "$tmp/pki/ca.pem" --tls-cert "$tmp/pki/$cert.pem" \
    --tls-key "$tmp/pki/$cert.key" 2>>"$tmp/$name.log" &
  local p=$!
  pids+=("$p")
  for _ in $(seq 200); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
  eval "${name}_pid=$p; ${name}_addr=127.0.0.1:$(cat "$tmp/$name.port" 2>/dev/null)"
}

call() {  # call ADDR OP [BODY]: the reply in $tmp/reply.json, the exit status returned
  timeout 60 "$bin" agent-call --agent "$1" "${ctl[@]}" "$2" "${3:-{\}}" >"$tmp/reply.json" 2>"$tmp/reply.err"
}

field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$tmp/reply.json" "$1"; }

wait_job() {  # wait_job ADDR JOB SECONDS: until the job is no longer running; its state printed
  local deadline=$((SECONDS + $3)) state=running
  while [ $SECONDS -lt $deadline ]; do
    call "$1" status "{\"job\": $2}" && state=$(field 'r["jobs"][0]["state"]')
    [ "$state" != running ] && break
    sleep 0.2
  done
  echo "$state"
}

record_of() {  # record_of VM: gpu-a's inventory entry of VM as a receive request's "vm"
  call "$a_addr" inventory
  python3 -c "import json,sys
r = json.load(open(sys.argv[1]))
v = [v for v in r['vms'] if v['name'] == sys.argv[2]][0]
dev = v.pop('device'); v.pop('host')
print(json.dumps({'name': v['name'], 'device': dev, 'inventory': v}))" "$tmp/reply.json" "$1"
}

start_agent a source
start_agent b dest
[ -n "${a_addr#127.0.0.1:}" ] && [ -n "${b_addr#127.0.0.1:}" ] || { echo "FAIL: the agents did not start"; cat "$tmp"/*.log; exit 1; }

call "$a_addr" inventory; check "inventory of gpu-a" 0 $?
json_check "$tmp/reply.json" 'r["host"]["name"] == "gpu-a" and [v["name"] for v in r["vms"]] == ["llm-1", "chat-1"] and r["vms"][0]["host"] == "gpu-a"' \
  "gpu-a reports its VMs in the planner's format"

# A controller whose certificate another CA signed: refused by both agents.
for who in a b; do
  addr_var=${who}_addr
  timeout 30 "$bin" agent-call --agent "${!addr_var}" --tls-ca "$tmp/foreign/ca.pem" --tls-cert "$tmp/foreign/source.pem" \
    --tls-key "$tmp/foreign/source.key" inventory >"$tmp/foreign.out" 2>"$tmp/foreign.err"
  check "gpu-$who refuses a foreign controller" 2 $?
  [ -s "$tmp/foreign.out" ] && { echo "FAIL: a reply reached the foreign controller"; fail=1; }
done
for _ in $(seq 100); do grep -q "refused 127.0.0.1:" "$tmp/a.log" && break; sleep 0.05; done
contains "gpu-a logs the refusal" "$tmp/a.log" "refused 127.0.0.1:"

# A wildcard listen address names no address a source could reach.
timeout 30 "$bin" agent --config "$tmp/b.json" --listen 0.0.0.0:0 --state-dir "$tmp/w" --tls-ca "$tmp/pki/ca.pem" \
  --tls-cert "$tmp/pki/dest.pem" --tls-key "$tmp/pki/dest.key" 2>"$tmp/w.err"
check "an agent on 0.0.0.0 without data_address refuses to start" 2 $?
contains "saying what to set" "$tmp/w.err" 'set "data_address"'


# Move llm-1 to gpu-b: receive there, migrate here, both jobs followed to the end.
vm=$(record_of llm-1)
call "$b_addr" receive "{\"vm\": $vm, \"gpus\": [0], \"placement\": 0}"; check "gpu-b prepares to receive llm-1" 0 $?
port=$(field 'r["port"]'); rjob=$(field 'r["job"]')
call "$a_addr" migrate "{\"vm\": \"llm-1\", \"to\": \"127.0.0.1:$port\", \"options\": {\"warmup\": \"200ms\"}}"
check "gpu-a starts migrating llm-1" 0 $?
mjob=$(field 'r["job"]')
state=$(wait_job "$a_addr" "$mjob" 90)
[ "$state" = completed ] && echo "ok: the migration completed" || { echo "FAIL: migration ended $state"; cat "$tmp/reply.json"; cat "$tmp/a/jobs/$mjob.err" | tail -5; fail=1; }
json_check "$tmp/reply.json" 'r["jobs"][0]["report"]["outcome"] == "completed"' "gpu-a keeps the migration's report"
state=$(wait_job "$b_addr" "$rjob" 30)
[ "$state" = completed ] && echo "ok: gpu-b received and verified llm-1" || { echo "FAIL: receive ended $state"; cat "$tmp/reply.json"; fail=1; }
json_check "$tmp/reply.json" 'r["jobs"][0]["report"]["verified"] is True' "gpu-b's report says verified"
call "$a_addr" inventory
json_check "$tmp/reply.json" '[v["name"] for v in r["vms"]] == ["chat-1"]' "llm-1 has left gpu-a"
call "$b_addr" inventory
json_check "$tmp/reply.json" '[(v["name"], v["host"], v["placement"]) for v in r["vms"]] == [("llm-1", "gpu-b", 0)]' \
  "llm-1 runs on gpu-b, at the slot it was given"

# gpu-b takes one migration at a time; in maintenance it takes none.
vm=$(record_of chat-1)
call "$b_addr" receive "{\"vm\": $vm, \"gpus\": [0], \"placement\": 4, \"accept_timeout\": \"8s\"}"
check "gpu-b prepares a receive that will time out" 0 $?
other=${vm/\"name\": \"chat-1\"/\"name\": \"chat-7\"}
call "$b_addr" receive "{\"vm\": $other, \"gpus\": [0], \"placement\": 5}"; check "a second receive is refused" 1 $?
contains "the refusal says why" "$tmp/reply.err" "busy: 1 of max_migrations 1"
call "$b_addr" receive "{\"vm\": $other, \"gpus\": [0], \"placement\": 0}"
contains "a slot taken is refused before busy" "$tmp/reply.err" "does not fit on gpu-b"
call "$b_addr" receive "{\"vm\": $vm, \"gpus\": [0], \"placement\": 6}"
contains "a VM already being received is refused" "$tmp/reply.err" "chat-1 is already in job"
state=$(wait_job "$b_addr" "$(python3 -c "import json;print(max(j['id'] for j in json.load(open('$tmp/b/state.json'))['jobs']))")" 30)
[ "$state" = failed ] && echo "ok: the unused receive failed and kept nothing" || { echo "FAIL: unused receive ended $state"; fail=1; }
call "$b_addr" maintenance '{"enter": true}'; check "gpu-b enters maintenance" 0 $?
call "$b_addr" receive "{\"vm\": $vm, \"gpus\": [0], \"placement\": 4}"; check "gpu-b in maintenance refuses" 1 $?
contains "saying so" "$tmp/reply.err" "in maintenance"
call "$b_addr" maintenance '{"enter": false}'; check "gpu-b leaves maintenance" 0 $?

# gpu-a killed mid-migration (capped, so it lasts seconds) and restarted: it
# finds the child still running and follows it to the end.
call "$b_addr" receive "{\"vm\": $vm, \"gpus\": [0], \"placement\": 4}"; port=$(field 'r["port"]'); rjob=$(field 'r["job"]')
call "$a_addr" migrate "{\"vm\": \"chat-1\", \"to\": \"127.0.0.1:$port\", \"options\": {\"bandwidth\": \"6MB/s\", \"warmup\": \"100ms\"}}"
mjob=$(field 'r["job"]')
sleep 0.5
kill -9 "$a_pid"; wait "$a_pid" 2>/dev/null
start_agent a source
contains "restarted gpu-a finds the migration still running" "$tmp/a.log" "job $mjob (migrate chat-1) is still running"
state=$(wait_job "$a_addr" "$mjob" 90)
[ "$state" = completed ] && echo "ok: the migration left running completed under the new agent" || { echo "FAIL: it ended $state"; cat "$tmp/reply.json"; fail=1; }
state=$(wait_job "$b_addr" "$rjob" 30)
[ "$state" = completed ] && echo "ok: gpu-b's receive of chat-1 completed" || { echo "FAIL: it ended $state"; fail=1; }
call "$b_addr" inventory
json_check "$tmp/reply.json" 'sorted(v["name"] for v in r["vms"]) == ["chat-1", "llm-1"]' "chat-1 runs on gpu-b"

# Back to gpu-a, and this time the migrating child dies with the agent: the
# restarted agent on gpu-b holds llm-1 (in doubt), never starts it again.
vm=$(python3 -c "import json
r = json.load(open('$tmp/b/state.json'))
v = [v for v in r['vms'] if v['name'] == 'llm-1'][0]
print(json.dumps(v))")
call "$a_addr" receive "{\"vm\": $vm, \"gpus\": [0], \"placement\": 0}"; port=$(field 'r["port"]')
call "$b_addr" migrate "{\"vm\": \"llm-1\", \"to\": \"127.0.0.1:$port\", \"options\": {\"bandwidth\": \"4MB/s\", \"warmup\": \"100ms\"}}"
mjob=$(field 'r["job"]')
sleep 0.5
jpid=$(python3 -c "import json;print([j['pid'] for j in json.load(open('$tmp/b/state.json'))['jobs'] if j['id'] == $mjob][0])")
kill -9 "$b_pid"; wait "$b_pid" 2>/dev/null
kill -9 -- "-$jpid" 2>/dev/null
sleep 0.3
start_agent b dest
contains "restarted gpu-b reports the vanished migration" "$tmp/b.log" "job $mjob (migrate llm-1) ended while the agent was down"
call "$b_addr" status "{\"job\": $mjob}"
json_check "$tmp/reply.json" 'r["jobs"][0]["state"] == "lost"' "the job is lost, not completed"
call "$b_addr" inventory
json_check "$tmp/reply.json" '"in doubt" in [v for v in r["vms"] if v["name"] == "llm-1"][0].get("held", "") or "without an exit status" in [v for v in r["vms"] if v["name"] == "llm-1"][0].get("held", "")' \
  "llm-1 stays on gpu-b, held"
call "$b_addr" migrate "{\"vm\": \"llm-1\", \"to\": \"127.0.0.1:1\"}"; check "a held VM is not migrated again" 1 $?
contains "saying it is held" "$tmp/reply.err" "llm-1 is held"
call "$b_addr" resolve '{"vm": "llm-1"}'; check "an operator resolves the hold" 0 $?

exit $fail
