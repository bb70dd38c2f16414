#!/usr/bin/env bash
# scripts/libvirt/qemu, the libvirt hook, as libvirtd calls it: `qemu DOMAIN OP SUBOP EXTRA`
# with the domain XML on stdin. On `migrate begin` it refuses (exit 1, reason on
# stderr naming the domain and both figures) when the predicted stun exceeds the
# limit, and when it cannot read the XML or the metadata; it passes domains without
# gpumigrate metadata; it never prints (empty output = XML unchanged). Every other
# operation exits 0 without reading stdin. Usage: libvirt_hook_test.sh [path/to/hook]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hook=${1:-$here/../../scripts/libvirt/qemu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
. "$here/lib.sh"

ns=https://gpumigrate.dev/xmlns/libvirt/1
domain() {  # domain METADATA-INNER-XML: a domain XML as libvirt passes it
  cat <<XML
<domain type='kvm' id='7'>
  <name>gpu-vm-1</name>
  <uuid>6c3bdf6e-6a53-4ba5-9a0a-1b3b0b1d2a11</uuid>
  $1
  <memory unit='KiB'>1048576</memory>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices>
</domain>
XML
}
# run NAME EXPECTED_RC OP SUBOP: feeds $tmp/in to the hook; output in $tmp/out and $tmp/err.
run() {
  "$hook" gpu-vm-1 "$3" "$4" - <"$tmp/in" >"$tmp/out" 2>"$tmp/err"; check "$1: exit code" "$2" $?
  if [ -s "$tmp/out" ]; then echo "FAIL: $1: printed on stdout (libvirt would take it as the new XML):"; cat "$tmp/out"; fail=1; fi
}
quiet() { if [ -s "$tmp/err" ]; then echo "FAIL: $1: stderr not empty:"; cat "$tmp/err"; fail=1; else echo "ok: $1: stderr empty"; fi; }
meta() { echo "<metadata><gm:migration xmlns:gm='$ns' $1/></metadata>"; }

# Within the limit, at the limit, and no gpumigrate metadata at all: pass.
domain "$(meta 'predicted_stun_ms="120" max_stun_ms="300"')" >"$tmp/in"; run "within the limit" 0 migrate begin; quiet "within the limit"
domain "$(meta 'predicted_stun_ms="300" max_stun_ms="300"')" >"$tmp/in"; run "at the limit" 0 migrate begin; quiet "at the limit"
domain "" >"$tmp/in"; run "no metadata" 0 migrate begin; quiet "no metadata"
domain "<metadata><other:app xmlns:other='https://example.com/x' predicted_stun_ms='900' max_stun_ms='1'/></metadata>" >"$tmp/in"
run "another application's metadata" 0 migrate begin; quiet "another application's metadata"
domain "<metadata><migration predicted_stun_ms='900' max_stun_ms='1'/></metadata>" >"$tmp/in"
run "an element without the gpumigrate namespace is not ours" 0 migrate begin

# Over the limit: refused, the reason names the domain and both figures.
domain "$(meta 'predicted_stun_ms="350" max_stun_ms="300"')" >"$tmp/in"; run "over the limit" 1 migrate begin
contains "reason names the domain" "$tmp/err" "gpu-vm-1"
contains "reason gives both figures" "$tmp/err" "predicted stun 350 ms exceeds max_stun_ms 300 ms"
# The metadata among others, with another prefix: still read.
domain "<metadata><a:x xmlns:a='urn:a'/><g:migration xmlns:g='$ns' max_stun_ms='50' predicted_stun_ms='51'/></metadata>" >"$tmp/in"
run "any prefix, among other metadata" 1 migrate begin; contains "51 over 50" "$tmp/err" "predicted stun 51 ms exceeds max_stun_ms 50 ms"

# A guard that cannot read its input refuses, saying why.
printf '<domain><name>gpu-vm-1</name><metadata>' >"$tmp/in"; run "truncated XML" 1 migrate begin
contains "truncated XML: reason" "$tmp/err" "cannot parse the domain XML"
: >"$tmp/in"; run "empty stdin" 1 migrate begin; contains "empty stdin: reason" "$tmp/err" "cannot parse"
echo '<capabilities/>' >"$tmp/in"; run "not a domain" 1 migrate begin; contains "not a domain: reason" "$tmp/err" "not a domain XML"
for bad in 'max_stun_ms="300"' 'predicted_stun_ms="120"' 'predicted_stun_ms="fast" max_stun_ms="300"' \
           'predicted_stun_ms="120" max_stun_ms="-1"' 'predicted_stun_ms="12.5" max_stun_ms="300"' \
           'predicted_stun_ms="" max_stun_ms="300"'; do
  domain "$(meta "$bad")" >"$tmp/in"; run "malformed metadata ($bad)" 1 migrate begin
  contains "malformed metadata ($bad): reason" "$tmp/err" "gpu-vm-1'.*gpumigrate metadata"
done
domain "<metadata>$(meta 'predicted_stun_ms="1" max_stun_ms="2"' | sed 's/<\/*metadata>//g')<gm:migration xmlns:gm='$ns' predicted_stun_ms='1' max_stun_ms='2'/></metadata>" >"$tmp/in"
run "two gpumigrate elements" 1 migrate begin; contains "two elements: reason" "$tmp/err" "expected one"

# Every other operation: exit 0, nothing printed, stdin not even read (an over-limit
# or broken XML must not matter there).
printf 'not xml at all' >"$tmp/in"
for opsub in "prepare begin" "start begin" "started begin" "stopped end" "release end" "migrate end" "restore begin" "reconnect begin" "attach begin"; do
  run "$opsub ignored" 0 $opsub; quiet "$opsub ignored"
done
"$hook" gpu-vm-1 release end - </dev/null >"$tmp/out" 2>&1; check "release end with no stdin" 0 $?
exit $fail
