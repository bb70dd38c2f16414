# Helpers shared by the two-process shell tests. Source it after setting
# `fail=0`; each helper prints "ok: ..." or "FAIL: ..." and sets fail=1 on failure.

# check NAME EXPECTED_RC ACTUAL_RC
check() { if [ "$2" != "$3" ]; then echo "FAIL: $1: exit code $3, expected $2"; fail=1; else echo "ok: $1"; fi; }

# contains NAME FILE TEXT (a grep pattern)
contains() {
  if grep -q -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1: '$3' not in $2:"; sed 's/^/    /' "$2" | tail -20; fail=1; fi
}

# json_check FILE PYTHON-EXPRESSION-ON-r MESSAGE: FILE holds one JSON object r.
json_check() {
  python3 - "$1" "$2" "$3" <<'PY' || fail=1
import json, sys
try:
    r = json.loads(open(sys.argv[1]).read())
except Exception as e:
    print(f"FAIL: {sys.argv[3]}: no JSON ({e})"); sys.exit(1)
if not eval(sys.argv[2]):
    print(f"FAIL: {sys.argv[3]}: {json.dumps(r)[:700]}"); sys.exit(1)
print(f"ok: {sys.argv[3]}")
PY
}

# start_workload NAME ARGS...: starts gpumigrate-workload ($wl) with ARGS, its
# output in $tmp/NAME.out and .err; sets $wpid (the workload's own pid, from its
# ready line) and $tpid (the `timeout` around it, to wait on) once it is ready,
# and adds both to the caller's `pids` (killed by its exit trap).
start_workload() {
  local name=$1; shift
  timeout 60 "$wl" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
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
