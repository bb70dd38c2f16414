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
