#!/usr/bin/env python3
"""Checks `estimate --project` at the scales this machine allows (issue 20): each
case projects from what was measured to a case that is then run for real, through
the path a user takes (two gpumigrate-workload processes, `migrate`/`receive`
across processes over PSK TLS on loopback), and reports the projection's error.

  perf/projection_check.py path/to/gpumigrate path/to/gpumigrate-workload [QUICK]

Cases (proc devices: a live process writing random data at a set rate):
  size     measured 256 MiB, projected to 2 GiB (--project 2GiB --project-dirty same:
           the workload writes at the same absolute rate), against a real 2 GiB run;
  workers  the pipeline projected to 1 and 2 source workers (`--threads`) x 1, 2 and 4
           data streams, against real runs of each (issue 38: the model of the
           pipeline as built, checked at small scale);
  link     a link capped at 150 MB/s, projected to 300 MB/s, against real runs
           (--bandwidth) of each.
The target is this host: `gpumigrate calibrate --profile-out` measured in the same
run, --cores = nproc, --shared-host (both ends on these cores).

Prints one JSON object per case: predicted and measured total, round-0 rate and
stun, and the errors (measured/predicted - 1), then a summary with the median
and worst absolute errors of the total time and of the round-0 rate (the
pipeline's throughput), and how many rates are within 15%."""
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
quick = len(sys.argv) > 3 and sys.argv[3] == "QUICK"
work = tempfile.mkdtemp(prefix="gm-projcheck-")
env = dict(os.environ, GPUMIGRATE_CALIBRATION=os.path.join(work, "cal.json"), GPUMIGRATE_SHIM_DIR=work)
procs = []
cores = os.cpu_count() or 1
RATE = "20MB/s"  # the workload's write rate: a KV cache appended while it migrates


def run(args, **kw):
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, **kw)


def workload(size, adopt=False):
    return proc_workload.start(wl, env, work, size, RATE, adopt, procs)


def estimate(device, extra):
    r = run([gm, "estimate", "--device", device, "--sample", "1s", "--warmup", "300ms", "--json",
             "--target", os.path.join(work, "target.json"), "--cores", str(cores), "--shared-host"] + extra)
    if r.returncode != 0:
        raise RuntimeError(f"estimate {extra}: {r.stderr}")
    return json.loads(r.stdout)


def migrate(size, streams, bandwidth=None, workers=None):
    src, dst = workload(size), workload(size, adopt=True)
    psk = ["--psk-file", os.path.join(work, "psk")]
    recv, port = proc_workload.start_receive(gm, env, work, f"proc:{dst.pid}", psk, procs)
    args = [gm, "migrate", "--to", f"127.0.0.1:{port}", "--device", f"proc:{src.pid}", "--streams", str(streams),
            "--warmup", "300ms", "--json"] + psk
    if bandwidth:
        args += ["--bandwidth", bandwidth]
    if workers:
        args += ["--threads", str(workers)]
    r = run(args)
    recv.wait(timeout=120)
    for p in (src, dst):
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    if r.returncode != 0:
        raise RuntimeError(f"migrate {size} x{streams} exited {r.returncode}: {r.stdout[-1500:]} {r.stderr[-1500:]}")
    return json.loads(r.stdout)


def compare(name, predicted, measured):
    r0p = predicted["predicted_rounds"][0]
    r0m = measured["rounds"][0]
    pred_rate = r0p["bytes"] / (r0p["ms"] / 1e3)
    meas_rate = r0m["bytes"] / (r0m["ms"] / 1e3)
    out = {
        "case": name,
        "predicted_total_ms": round(predicted["predicted_total_ms"], 1),
        "measured_total_ms": measured["total_ms"],
        "total_error": round(measured["total_ms"] / predicted["predicted_total_ms"] - 1, 4),
        "predicted_round0_bytes_per_s": round(pred_rate),
        "measured_round0_bytes_per_s": round(meas_rate),
        "round0_rate_error": round(meas_rate / pred_rate - 1, 4),
        "predicted_stun_ms": round(predicted["predicted_stun_ms"], 2),
        "measured_stun_ms": measured["stun_ms"],
        "binds": predicted.get("target_pipeline", {}).get("binds"),
        "source_workers": measured.get("source_workers"),
        "measured_rounds": len(measured["rounds"]),
        "predicted_rounds": len(predicted["predicted_rounds"]),
    }
    print(json.dumps(out), flush=True)
    return out


def main():
    with open(os.path.join(work, "psk"), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    r = run([gm, "calibrate", "--profile-out", os.path.join(work, "target.json"), "--json"])
    if r.returncode != 0:
        raise RuntimeError(f"calibrate: {r.stderr}")
    print(json.dumps({"host_profile": json.loads(r.stdout)["host_profile"]}), flush=True)
    small, big = ("128MiB", "1GiB") if quick else ("256MiB", "2GiB")
    results = []

    src = workload(small)
    pred = estimate(f"proc:{src.pid}", ["--project", big, "--project-dirty", "same", "--streams", "2"])
    src.kill()
    results.append(compare(f"size {small} -> {big}", pred, migrate(big, 2)))

    for workers in (1, 2):
        for streams in ((1, 2) if quick else (1, 2, 4)):
            src = workload(small)
            pred = estimate(f"proc:{src.pid}", ["--project", big, "--project-dirty", "same", "--streams",
                                                str(streams), "--threads", str(workers)])
            src.kill()
            results.append(compare(f"workers {workers}, streams {streams}", pred,
                                   migrate(big, streams, workers=workers)))

    for link in ("150MB/s", "300MB/s"):
        src = workload(small)
        pred = estimate(f"proc:{src.pid}", ["--project", small, "--project-dirty", "same", "--streams", "2",
                                            "--link", link])
        src.kill()
        results.append(compare(f"link {link}", pred, migrate(small, 2, bandwidth=link)))

    errs = [abs(x["total_error"]) for x in results]
    rate_errs = [abs(x["round0_rate_error"]) for x in results]
    print(json.dumps({"summary": "projection check", "cases": len(results),
                      "total_error_median": round(statistics.median(errs), 4),
                      "total_error_worst": round(max(errs), 4),
                      "round0_rate_error_median": round(statistics.median(rate_errs), 4),
                      "round0_rate_error_worst": round(max(rate_errs), 4),
                      "round0_rate_within_15pct": sum(e <= 0.15 for e in rate_errs)}), flush=True)


try:
    main()
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
    shutil.rmtree(work, ignore_errors=True)
