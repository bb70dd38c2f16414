#!/usr/bin/env bash
# --plot on `demo`, `migrate` (loopback TLS, two processes) and `estimate`: a
# real PNG drawn by gnuplot after the report; the name checked before anything
# moves or is observed (a name gnuplot cannot hold, a directory nobody can write,
# gnuplot missing: exit 2, no migration, no estimate); `estimate --project-table
# --plot` still writes its SVG. Usage: plot_test.sh path/to/gpumigrate
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail=0
. "$here/lib.sh"
export GPUMIGRATE_CALIBRATION="$tmp/calibration.json"
dev="sim:size=64MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms"

is_png() {  # NAME FILE: gnuplot's PNG, of a size that holds four panels
  local size
  size=$(stat -c %s "$2" 2>/dev/null || echo 0)
  if [ "$(head -c 8 "$2" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] && [ "$size" -gt 20000 ]; then
    echo "ok: $1 ($size bytes)"
  else
    echo "FAIL: $1: $2 is not a PNG of four panels ($size bytes)"; fail=1
  fi
}

# Refused before anything moves, gnuplot or not.
"$bin" demo --device "$dev" --warmup 0s --plot "$tmp/it's.png" >"$tmp/q.out" 2>"$tmp/q.err"
check "a quote in the --plot name exits 2" 2 $?
contains "a quote in the --plot name: says so" "$tmp/q.err" "may not contain a quote"
"$bin" demo --device "$dev" --warmup 0s --plot "$tmp/no/such/dir/x.png" >"$tmp/d.out" 2>"$tmp/d.err"
check "--plot into a missing directory exits 2" 2 $?
contains "--plot into a missing directory: names it" "$tmp/d.err" "cannot write in $tmp/no/such/dir"
mkdir "$tmp/nognuplot"
PATH="$tmp/nognuplot" "$bin" demo --device "$dev" --warmup 0s --plot "$tmp/x.png" >"$tmp/n.out" 2>"$tmp/n.err"
check "--plot without gnuplot exits 2" 2 $?
contains "--plot without gnuplot says how to install it" "$tmp/n.err" "needs gnuplot.*apt-get install gnuplot-nox"
for f in q d n; do
  if grep -q "round 0" "$tmp/$f.err" || [ -s "$tmp/$f.out" ]; then echo "FAIL: a refused --plot ($f) migrated first"; fail=1; fi
done
echo "ok: a refused --plot migrated nothing"
"$bin" estimate --device "$dev" --sample 200ms --transport in-process --plot "$tmp/it's.png" >"$tmp/eq.out" 2>"$tmp/eq.err"
check "estimate: a quote in the --plot name exits 2" 2 $?
PATH="$tmp/nognuplot" "$bin" estimate --device "$dev" --sample 200ms --transport in-process --plot "$tmp/x.png" \
  >"$tmp/en.out" 2>"$tmp/en.err"
check "estimate --plot without gnuplot exits 2" 2 $?
contains "estimate --plot without gnuplot says so" "$tmp/en.err" "needs gnuplot"
for f in eq en; do
  if grep -q "observing" "$tmp/$f.err" || [ -s "$tmp/$f.out" ]; then echo "FAIL: a refused --plot ($f) observed first"; fail=1; fi
done
echo "ok: a refused estimate --plot observed nothing"
# The table's SVG needs no gnuplot.
PATH="$tmp/nognuplot" "$bin" estimate --device "$dev" --sample 200ms --project 80GB --project-table \
  --table-gpus 1 --table-links 100Gbit --plot "$tmp/table.svg" >"$tmp/t.out" 2>"$tmp/t.err"
check "estimate --project-table --plot" 0 $?
contains "estimate --project-table --plot writes an SVG" "$tmp/table.svg" "<svg"

if ! command -v gnuplot >/dev/null; then
  echo "skip: gnuplot is not installed: no PNG drawn (scripts/bootstrap installs gnuplot-nox)"
  exit $fail
fi

# demo: the PNG, and the JSON on stdout unchanged by it.
"$bin" demo --device "$dev" --warmup 200ms --bandwidth 100MB/s --json --plot "$tmp/demo.png" >"$tmp/demo.json" \
  2>"$tmp/demo.err"
check "demo --plot" 0 $?
is_png "demo --plot draws a PNG" "$tmp/demo.png"
contains "demo --plot says where" "$tmp/demo.err" "plot drawn to $tmp/demo.png"
json_check "$tmp/demo.json" 'r["outcome"] == "completed" and all("start_ms" in x for x in r["rounds"]) and r["stun_start_ms"] > 0' \
  "demo --json: each round's start and the stun's, for the plot"

# migrate to a receiver over loopback TLS.
openssl rand -hex 32 >"$tmp/psk"
timeout 60 "$bin" receive --listen 127.0.0.1:0 --port-file "$tmp/port" --device "$dev" --psk-file "$tmp/psk" \
  --run-after 50ms >"$tmp/recv.out" 2>"$tmp/recv.err" &
rpid=$!
pids+=("$rpid")
for _ in $(seq 200); do [ -s "$tmp/port" ] && break; sleep 0.05; done
timeout 60 "$bin" migrate --device "$dev" --to 127.0.0.1:"$(cat "$tmp/port")" --psk-file "$tmp/psk" --warmup 200ms \
  --bandwidth 100MB/s --plot "$tmp/migrate.png" >"$tmp/migrate.out" 2>"$tmp/migrate.err"
check "migrate --plot" 0 $?
wait "$rpid"; check "receive" 0 $?
is_png "migrate --plot draws a PNG" "$tmp/migrate.png"
contains "migrate --plot: the report printed too" "$tmp/migrate.out" "completed"
# estimate: the prediction as a PNG, the JSON unchanged by it.
"$bin" estimate --device "$dev" --sample 500ms --transport in-process --downtime-target 20ms --json \
  --plot "$tmp/estimate.png" >"$tmp/estimate.json" 2>"$tmp/estimate.err"
check "estimate --plot" 0 $?
is_png "estimate --plot draws a PNG" "$tmp/estimate.png"
contains "estimate --plot says where" "$tmp/estimate.err" "plot drawn to $tmp/estimate.png"
json_check "$tmp/estimate.json" '"decision" in r and len(r["predicted_rounds"]) >= 1' "estimate --json with --plot"
[ -n "${PLOT_KEEP:-}" ] && cp "$tmp"/*.png "$PLOT_KEEP"/
exit $fail
