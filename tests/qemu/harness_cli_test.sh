#!/usr/bin/env bash
# qemu_harness.py's CLI as a shell test that hands the QEMUs to another program
# would use it: start-pair, qmp, wait-migration, copy-device, wait-pass, stop; the
# reaper that stops a forgotten pair. Usage: harness_cli_test.sh GUEST_ELF
# Exit 77 (skip) without qemu-system-x86_64 or the guest.
set -uo pipefail
guest=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
hx=(timeout 60 python3 "$here/qemu_harness.py")
command -v "${GM_QEMU:-qemu-system-x86_64}" >/dev/null || { echo "SKIP: qemu-system-x86_64 not found"; exit 77; }
[ -n "$guest" ] && [ -f "$guest" ] || { echo "SKIP: no test guest ('$guest')"; exit 77; }
tmp=$(mktemp -d)
trap '"${hx[@]}" stop --dir "$tmp/a"; "${hx[@]}" stop --dir "$tmp/b"; rm -rf "$tmp"' EXIT
fail=0
. "$here/../cli/lib.sh"
qmp() { "${hx[@]}" qmp --dir "$tmp/a" "$@"; }
caps='{"capabilities":[{"capability":"events","state":true},{"capability":"return-path","state":true},{"capability":"x-ignore-shared","state":true}'

"${hx[@]}" start-pair --dir "$tmp/a" --guest "$guest" --ram-mb 64 --dev-mb 32 >"$tmp/pair.json"; check "start-pair" 0 $?
json_check "$tmp/pair.json" 'r["src"]["dev_path"].startswith("/dev/shm/") and r["uri"].startswith("unix:") and r["dev_base"] == 64 << 20' "pair description"
uri=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["uri"])' "$tmp/pair.json")
src_dev=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["src"]["dev_path"])' "$tmp/pair.json")
"${hx[@]}" wait-pass --dir "$tmp/a" --side src --pass 2 --timeout 30 >"$tmp/p2"; check "wait-pass on the source" 0 $?
json_check "$tmp/p2" 'r["pass"] >= 2 and r["ram_bad"] == 0 and r["dev_bad"] == 0' "source pass clean"

qmp --side src migrate-set-capabilities "$caps"',{"capability":"pause-before-switchover","state":true}]}' >/dev/null; check "source caps" 0 $?
qmp --side dst migrate-set-capabilities "$caps]}" >/dev/null; check "destination caps" 0 $?
qmp --side dst migrate-incoming "{\"uri\":\"$uri\"}" >/dev/null; check "migrate-incoming" 0 $?
qmp --side src migrate "{\"uri\":\"$uri\"}" >/dev/null; check "migrate" 0 $?
"${hx[@]}" wait-migration --dir "$tmp/a" --side src --status pre-switchover >/dev/null; check "source at pre-switchover" 0 $?
last=$(sed -n 's/^pass \([0-9]*\) .*/\1/p' "$tmp/a/src.con" | tail -1)
"${hx[@]}" copy-device --dir "$tmp/a"; check "copy-device" 0 $?
qmp --side src migrate-continue '{"state":"pre-switchover"}' >/dev/null; check "migrate-continue" 0 $?
"${hx[@]}" wait-migration --dir "$tmp/a" --side src --status completed >/dev/null; check "source completed" 0 $?
"${hx[@]}" wait-migration --dir "$tmp/a" --side dst --status completed >/dev/null; check "destination completed" 0 $?
qmp --side dst cont >/dev/null; check "cont" 0 $?
"${hx[@]}" wait-pass --dir "$tmp/a" --side dst --pass $((last + 3)) --timeout 20 >/dev/null; check "destination passes on" 0 $?
if grep '^pass ' "$tmp/a/dst.con" | grep -qv 'ram_bad=0 dev_bad=0'; then
  echo "FAIL: destination saw bad pages:"; head -5 "$tmp/a/dst.con"; fail=1
else echo "ok: destination passes clean"; fi
qmp --side src no-such-command >/dev/null 2>"$tmp/err"; check "a QMP error exits 1" 1 $?
contains "the QMP error is named" "$tmp/err" "CommandNotFound"

"${hx[@]}" stop --dir "$tmp/a"; check "stop" 0 $?
[ -e "$src_dev" ] && { echo "FAIL: $src_dev left behind"; fail=1; } || echo "ok: stop removed the device files"
pgrep -f "$tmp/a/" >/dev/null && { echo "FAIL: QEMU still running after stop"; fail=1; } || echo "ok: stop ended both QEMUs"

# A pair nobody stops: the reaper ends it after --max-life seconds.
"${hx[@]}" start-pair --dir "$tmp/b" --guest "$guest" --max-life 2 >/dev/null; check "start-pair with --max-life 2" 0 $?
for _ in $(seq 100); do pgrep -f "$tmp/b/" >/dev/null || break; sleep 0.1; done
pgrep -f "$tmp/b/" >/dev/null && { echo "FAIL: the reaper did not stop the pair"; fail=1; } || echo "ok: the reaper stopped the pair"
exit $fail
