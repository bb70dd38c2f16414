#!/usr/bin/env python3
"""Content-addressed pre-copy benchmark (issue 42), through the CLI a user runs:
`receive` and `migrate` as two processes over PSK TLS on loopback.

  perf/dedup.py path/to/gpumigrate [SIZES] [RUNS] [CAP]

SIZES: comma-separated sim sizes (default 1GiB,4GiB); RUNS: repetitions of each
case (default 1); CAP: a rate cap for every migration (`migrate --bandwidth`,
e.g. 250MB/s: a link slower than loopback), default none. For each size, a sim:llm device (page 4 KiB) migrated three
ways in the same run:
  plain  the destination has no content store (the peer every figure is beside);
  held   its content store holds this model's weights (`content-store add`: the
         sim's static region written as a raw file, then indexed);
  other  its content store holds another model's weights (another seed).
Prints one JSON object per migration (bytes on the wire, round 0 time, total,
stun, what the store filled) and one summary per size with the issue's goals:
weights bytes that crossed the link <= 2% of the weights, held round 0 <= 0.25
of plain round 0, other within 3% of plain (total time and bytes). The floor:
SHA-256 per core (hashlib, OpenSSL), which bounds what an offer can cost."""
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

gm = sys.argv[1]
sizes = (sys.argv[2] if len(sys.argv) > 2 else "1GiB,4GiB").split(",")
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
cap = sys.argv[4] if len(sys.argv) > 4 else ""
work = tempfile.mkdtemp(prefix="gm-dedup-perf-")
env = dict(os.environ, GPUMIGRATE_CALIBRATION=os.path.join(work, "cal.json"))
psk = os.path.join(work, "psk")
with open(psk, "w") as f:
    f.write(os.urandom(32).hex() + "\n")


def emit(obj):
    print(json.dumps(obj), flush=True)


def sha256_rate():
    block = os.urandom(1 << 20)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.5:
        for i in range(0, len(block), 4096):
            hashlib.sha256(block[i:i + 4096]).digest()
        n += len(block)
    return n / (time.perf_counter() - t0)


def add_store(name, dev):
    d = os.path.join(work, name)
    os.mkdir(d)
    out = subprocess.run([gm, "content-store", "add", d, "--device", dev, "--page-size", "4KiB", "--json"],
                         env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"content-store add {dev}: {out.stderr}")
    return d, json.loads(out.stdout)


def migrate(dev, store):
    port_file = os.path.join(work, "port")
    if os.path.exists(port_file):
        os.unlink(port_file)
    recv_cmd = [gm, "receive", "--listen", "127.0.0.1:0", "--port-file", port_file, "--device", dev,
                "--psk-file", psk, "--json", "--run-after", "50ms"]
    if store:
        recv_cmd += ["--content-store", store]
    recv = subprocess.Popen(recv_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for _ in range(600):
        if os.path.exists(port_file) and open(port_file).read().strip():
            break
        time.sleep(0.05)
    port = open(port_file).read().strip()
    t0 = time.monotonic()
    src = subprocess.run([gm, "migrate", "--device", dev, "--to", f"127.0.0.1:{port}", "--psk-file", psk,
                          "--streams", "2", "--warmup", "200ms", "--json"] + (["--bandwidth", cap] if cap else []),
                         env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    rout, _ = recv.communicate(timeout=300)
    if src.returncode != 0 or recv.returncode != 0:
        sys.exit(f"migration failed ({src.returncode}/{recv.returncode}): {src.stdout[-2000:]} {src.stderr[-2000:]}")
    s, d = json.loads(src.stdout), json.loads(rout)
    return {"bytes_sent": s["bytes_sent"], "round0_ms": s["rounds"][0]["ms"], "rounds": len(s["rounds"]),
            "total_ms": s["total_ms"], "stun_ms": s["stun_ms"], "wall_s": round(wall, 3),
            "offered_pages": s["offered_pages"], "dedup_bytes": d["dedup_bytes"], "verified": s["verified"],
            "self_check": d["destination"]["self_check"]}


emit({"floor": "sha256_4KiB_pages_one_core", "bytes_per_s": round(sha256_rate())})
for size in sizes:
    dev = f"sim:llm,size={size},page=4KiB"
    held_store, held_info = add_store(f"held-{size}", dev)
    other_store, _ = add_store(f"other-{size}", dev + ",seed=2")
    weights = held_info["file_bytes"]
    cases = {"plain": [], "held": [], "other": []}
    order = [("plain", None), ("held", held_store), ("other", other_store)]
    for i in range(runs):
        # The order turns each run, so no case always follows the same one (a
        # page cache or memory state left by the one before).
        for case, store in order[i % 3:] + order[:i % 3]:
            r = migrate(dev, store)
            r.update({"size": size, "case": case, "run": i, "cap": cap or None})
            emit(r)
            cases[case].append(r)
    med = {c: {k: statistics.median(x[k] for x in rs) for k in ("bytes_sent", "round0_ms", "total_ms", "dedup_bytes")}
           for c, rs in cases.items()}
    weights_sent = max(0, weights - med["held"]["dedup_bytes"])
    summary = {
        "size": size, "runs": runs, "cap": cap or None, "weights_bytes": weights,
        "held_weights_bytes_sent_fraction": round(weights_sent / weights, 4),
        "held_bytes_sent_vs_plain": round(med["held"]["bytes_sent"] / med["plain"]["bytes_sent"], 3),
        "held_round0_vs_plain": round(med["held"]["round0_ms"] / med["plain"]["round0_ms"], 3),
        "held_total_vs_plain": round(med["held"]["total_ms"] / med["plain"]["total_ms"], 3),
        "other_total_vs_plain": round(med["other"]["total_ms"] / med["plain"]["total_ms"], 3),
        "other_bytes_sent_vs_plain": round(med["other"]["bytes_sent"] / med["plain"]["bytes_sent"], 3),
    }
    summary["goal_weights_sent_le_2pct"] = summary["held_weights_bytes_sent_fraction"] <= 0.02
    summary["goal_round0_le_0.25"] = summary["held_round0_vs_plain"] <= 0.25
    summary["goal_other_within_3pct"] = abs(summary["other_total_vs_plain"] - 1) <= 0.03
    emit(summary)
    shutil.rmtree(held_store)
    shutil.rmtree(other_store)
shutil.rmtree(work)
