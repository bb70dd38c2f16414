#!/usr/bin/env python3
"""The final round of a workload that writes at random: scattered single pages,
each its own frame (issue 40's worst case for the stun), through what a user
runs: two gpumigrate-workload processes (proc devices, memfd memory), `migrate`
-> `receive` across processes over PSK TLS on loopback.

  perf/scattered_pages.py GPUMIGRATE GPUMIGRATE_WORKLOAD [SIZE] [RATE] [RUNS]

SIZE: the workload's memory (default 512MiB); RATE: its random 4 KiB writes
(default 100MB/s), so round 0 leaves thousands of single dirty pages behind;
RUNS: migrations (default 5). 2 data streams, 2 source workers.

Prints one JSON object per run (round 0's rate, the final round's pages, time
and microseconds per page, the stun and its breakdown) and a summary with the
medians."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import proc_workload

gm, wl = sys.argv[1], sys.argv[2]
size = sys.argv[3] if len(sys.argv) > 3 else "512MiB"
rate = sys.argv[4] if len(sys.argv) > 4 else "100MB/s"
runs = int(sys.argv[5]) if len(sys.argv) > 5 else 5
work = tempfile.mkdtemp(prefix="gm-scattered-")
env = dict(os.environ, GPUMIGRATE_CALIBRATION=os.path.join(work, "cal.json"), GPUMIGRATE_SHIM_DIR=work)
procs = []


def workload(adopt):
    return proc_workload.start(wl, env, work, size, rate, adopt, procs)


def one():
    src, dst = workload(False), workload(True)
    psk = ["--psk-file", os.path.join(work, "psk")]
    recv, port = proc_workload.start_receive(gm, env, work, f"proc:{dst.pid}", psk, procs)
    r = subprocess.run([gm, "migrate", "--to", f"127.0.0.1:{port}", "--device", f"proc:{src.pid}", "--streams", "2",
                        "--threads", "2", "--warmup", "300ms", "--json"] + psk, env=env, capture_output=True,
                       text=True, timeout=300)
    recv.wait(timeout=120)
    for p in (src, dst):
        p.kill()
        p.wait()
    if r.returncode != 0:
        raise RuntimeError(f"migrate exited {r.returncode}: {r.stdout[-1500:]} {r.stderr[-1500:]}")
    m = json.loads(r.stdout)
    r0, last = m["rounds"][0], m["rounds"][-1]
    return {"round0_bytes_per_s": round(r0["bytes"] / (r0["ms"] / 1e3)), "rounds": len(m["rounds"]),
            "final_pages": last["pages_sent"], "final_ms": last["ms"],
            "final_us_per_page": round(last["ms"] * 1e3 / max(1, last["pages_sent"]), 2),
            "stun_ms": m["stun_ms"], "stun_breakdown_ms": m["stun_breakdown_ms"], "verified": m["verified"]}


try:
    with open(os.path.join(work, "psk"), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    results = []
    for i in range(runs):
        res = one()
        results.append(res)
        print(json.dumps(dict(run=i, size=size, rate=rate, **res)), flush=True)
    med = lambda k: statistics.median(r[k] for r in results)
    print(json.dumps({"summary": "scattered pages", "size": size, "rate": rate, "runs": runs,
                      "final_us_per_page_median": med("final_us_per_page"), "stun_ms_median": med("stun_ms"),
                      "final_pages_median": med("final_pages"), "round0_bytes_per_s_median": med("round0_bytes_per_s"),
                      "verified": all(r["verified"] for r in results)}), flush=True)
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
    shutil.rmtree(work, ignore_errors=True)
