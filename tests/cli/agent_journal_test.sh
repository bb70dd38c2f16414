#!/usr/bin/env bash
# `gpumigrate agent` run as systemd runs it logs to the journal with structured
# fields (issue 43): in a private mount namespace (unshare -m), a tmpfs over
# /run holds /run/systemd/journal/socket, bound by a stand-in for journald that
# keeps every datagram of the native protocol (KEY=VALUE lines, or KEY, a
# 64-bit length and the bytes); the agents' stderr is a file whose DEV:INODE
# JOURNAL_STREAM names, as systemd sets it. A VM is moved between two agents;
# the journal must hold the source's job events with GPUMIGRATE_VM, _JOB,
# _KIND and _PHASE (started, a pre-copy round, completed). Without
# JOURNAL_STREAM the same lines go to stderr. Needs root (exit 77 otherwise).
# Usage: agent_journal_test.sh gpumigrate
set -uo pipefail
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "agent_journal_test: skipped: needs root and unshare -m"; exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$here/../../scripts/make-test-certs" "$tmp/pki" 127.0.0.1 2>/dev/null

cat >"$tmp/journald.py" <<'PY'
import socket, struct, sys, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
open(sys.argv[2] + ".ready", "w").close()
out = open(sys.argv[2], "a")
while True:
    data, anc, flags, addr = s.recvmsg(1 << 20, socket.CMSG_SPACE(64))
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:  # KEY\n<u64 le length><bytes>\n
            k = line
            n = struct.unpack("<Q", data[nl + 1:nl + 9])[0]
            v = data[nl + 9:nl + 9 + n]
            i = nl + 9 + n + 1
        fields[k.decode()] = v.decode(errors="replace")
    out.write(json.dumps(fields) + "\n")
    out.flush()
PY

cat >"$tmp/a.json" <<'J'
{ "version": 1, "host": { "name": "gpu-a", "link": "10Gbit", "max_migrations": 2,
    "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] },
  "vms": [ { "name": "llm-1", "device": "sim:size=16MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s", "gpus": [0],
             "profile": "3g.40gb", "placement": 0, "class": "inference" } ] }
J
cat >"$tmp/b.json" <<'J'
{ "version": 1, "host": { "name": "gpu-b", "link": "10Gbit", "max_migrations": 2,
    "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" } ] }, "vms": [] }
J

cat >"$tmp/inside.sh" <<'SH'
set -u
bin=$1 tmp=$2
mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal || exit 3
python3 "$tmp/journald.py" /run/systemd/journal/socket "$tmp/journal.jsonl" & jd=$!
for _ in $(seq 100); do [ -e "$tmp/journal.jsonl.ready" ] && break; sleep 0.05; done
ctl=(--tls-ca "$tmp/pki/ca.pem" --tls-cert "$tmp/pki/source.pem" --tls-key "$tmp/pki/source.key")
for h in a b; do
  : >"$tmp/$h.err"
  JOURNAL_STREAM=$(stat -c %d:%i "$tmp/$h.err") "$bin" agent --config "$tmp/$h.json" --listen 127.0.0.1:0 \
    --port-file "$tmp/$h.port" --state-dir "$tmp/$h" "${ctl[@]/source/$([ $h = a ] && echo source || echo dest)}" \
    2>>"$tmp/$h.err" & eval "${h}_pid=$!"
done
for _ in $(seq 200); do [ -s "$tmp/a.port" ] && [ -s "$tmp/b.port" ] && break; sleep 0.05; done
A=127.0.0.1:$(cat "$tmp/a.port") B=127.0.0.1:$(cat "$tmp/b.port")
timeout 30 "$bin" agent-call --agent "$B" "${ctl[@]}" receive '{"vm": {"name": "llm-1", "device": "sim:size=16MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s",
  "inventory": {"gpus": [0], "profile": "3g.40gb", "placement": 0, "class": "inference"}}, "gpus": [0], "placement": 0}' >"$tmp/r.json"
port=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['port'])" "$tmp/r.json")
timeout 30 "$bin" agent-call --agent "$A" "${ctl[@]}" migrate "{\"vm\": \"llm-1\", \"to\": \"127.0.0.1:$port\", \"options\": {\"bandwidth\": \"4MB/s\"}}" >/dev/null
for _ in $(seq 300); do grep -q '"GPUMIGRATE_PHASE": "completed"' "$tmp/journal.jsonl" 2>/dev/null && break; sleep 0.1; done
sleep 0.5
kill "$a_pid" "$b_pid" 2>/dev/null; wait "$a_pid" "$b_pid" 2>/dev/null
kill "$jd"; wait "$jd" 2>/dev/null
for s in a b; do python3 -c "import json,os,signal,sys
for j in json.load(open(sys.argv[1]))['jobs']:
    try: os.killpg(j['pid'], signal.SIGKILL)
    except Exception: pass" "$tmp/$s/state.json" 2>/dev/null; done
exit 0
SH
timeout 120 unshare -m --propagation private bash "$tmp/inside.sh" "$bin" "$tmp"
rc=$?
[ $rc = 0 ] || { echo "FAIL: the run in the mount namespace ended $rc"; cat "$tmp"/a.err; exit 1; }

python3 - "$tmp/journal.jsonl" "$tmp/a.err" <<'PY'
import json, sys
fail = 0
def check(what, ok, detail=""):
    global fail
    print(("ok: " if ok else "FAIL: ") + what + ("" if ok else f": {detail}"))
    fail |= not ok
entries = [json.loads(l) for l in open(sys.argv[1])]
ours = [e for e in entries if e.get("SYSLOG_IDENTIFIER") == "gpumigrate-agent"]
check("the agents wrote to the journal", len(ours) > 0, f"{len(entries)} datagrams")
mig = [e for e in ours if e.get("GPUMIGRATE_VM") == "llm-1" and e.get("GPUMIGRATE_KIND") == "migrate"]
phases = [e.get("GPUMIGRATE_PHASE") for e in mig]
check("the migration's events carry GPUMIGRATE_VM and GPUMIGRATE_KIND", len(mig) >= 3, json.dumps(ours)[:2000])
check("GPUMIGRATE_PHASE: started, then a pre-copy round, then completed",
      phases[:1] == ["started"] and any(p.startswith("round-") for p in phases) and phases[-1:] == ["completed"], str(phases))
check("each with GPUMIGRATE_JOB, PRIORITY and MESSAGE", all(e.get("GPUMIGRATE_JOB", "").isdigit() and
      e.get("PRIORITY") == "6" and "llm-1" in e.get("MESSAGE", "") for e in mig), json.dumps(mig)[:1500])
recv = [e.get("GPUMIGRATE_PHASE") for e in ours if e.get("GPUMIGRATE_KIND") == "receive"]
check("the receive's too (started ... completed)", recv[:1] == ["started"] and recv[-1:] == ["completed"], str(recv))
err = open(sys.argv[2]).read()
check("the job events went to the journal, not also to stderr", "job 1" not in err, err[-1500:])
sys.exit(1 if fail else 0)
PY
