#!/usr/bin/env python3
"""perf/run evacuate: a host evacuation run for real against its plan.

    perf/evacuate.py GPUMIGRATE [--rate 200mbit] [--hosts 5]

A fleet of --hosts network namespaces (tests/cluster/cluster.py), every link
shaped to --rate, one agent per host; gpu-a holds four sim VMs of different
sizes on MIG slices, the other hosts are empty. Each VM's estimate is
`gpumigrate estimate --json --link RATE` of its own sim (a fresh calibration
first), so the plan predicts this fleet and not a real one. Then:
  1. the plan (`evacuate --dry-run --json`): total_ms (pipelined) and
     batched_total_ms;
  2. the evacuation as planned (`evacuate --yes`), wall time;
  3. the fleet built again, and the same evacuation in fixed batches
     (`evacuate --yes --batched`), wall time;
  4. the fleet built again, and the same evacuation with its links left to
     TCP (`evacuate --yes --no-pace`): the peer of the paced run, whose
     migrations are each paced at the share of the link the plan gives them.
One JSON line: each wall time beside the plan's prediction for it, the
pipelined run beside the batched one (its peer in the same run), and per VM of
each run: the predicted stun beside the measured one (and their error), the
plan's start and end beside the migrate job's (ms from the evacuation's start),
the share the plan gave its final round (and how many migrations beside it),
and the rounds the engine ran (the pipelined run: the plan's per-VM figures are
its schedule's); then the median and worst stun error over those VMs. `--dump FILE` also writes the plans, reports and agents' job
records. Needs root.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
import cluster  # noqa: E402
from fleet import Fleet, mig_gpus  # noqa: E402

VMS = [  # gpu-a's VMs: name, sim size, profile, MIG start slice
    ("llm-1", "96MiB", "3g.40gb", 0),
    ("llm-2", "64MiB", "1g.10gb", 4),
    ("llm-3", "48MiB", "1g.10gb", 5),
    ("llm-4", "32MiB", "1g.10gb", 6),
]


def spec(size):
    return f"sim:size={size},static=0.9,hot=1MiB,kv_rate=1MiB/s"


def rate_text(tc_rate):  # "200mbit" -> "200Mbit" (the CLI's units)
    return tc_rate[:-4] + "Mbit" if tc_rate.endswith("mbit") else tc_rate[:-4] + "Gbit"


def run_fleet(binary, rate, hosts, estimates, extra):
    """Builds the fleet, runs one evacuation; returns (wall_ms, report, dry-run plan)."""
    names = [f"gpu-{chr(ord('a') + i)}" for i in range(hosts)]
    spec_of = {h: {"gpus": mig_gpus("mig")} for h in names}
    spec_of["gpu-a"]["vms"] = [{"name": name, "device": spec(size), "gpus": [0], "profile": profile,
                                "placement": start, "class": "inference"} for name, size, profile, start in VMS]
    inv_vms = [{"name": name, "host": "gpu-a", "gpus": [0], "profile": profile, "placement": start,
                "class": "inference", "estimate": estimates[name]} for name, _, profile, start in VMS]
    with Fleet(binary, spec_of, rate=rate, link=rate_text(rate), inventory_vms=inv_vms) as f:
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--dry-run", "--json"))
        if r.returncode != 0:
            raise RuntimeError(f"the plan is not feasible: {r.stdout} {r.stderr}")
        plan = json.loads(r.stdout)
        t0, t0_unix_ms = time.monotonic(), time.time() * 1000
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--yes", "--json", "--store", f"{f.tmp}/store", *extra), timeout=900)
        wall_ms = (time.monotonic() - t0) * 1000
        if r.returncode != 0:
            raise RuntimeError(f"evacuate {' '.join(extra)} exited {r.returncode}: {r.stderr[-2000:]}")
        jobs = [j for j in f.jobs("gpu-a") if j["kind"] == "migrate"]
        return wall_ms, json.loads(r.stdout), plan, {"t0_unix_ms": t0_unix_ms, "jobs": jobs}


def per_vm(plan, report, run):
    """Per VM: the plan's prediction beside what its migration did."""
    measured = {v["vm"]: v for v in report["vms"]}
    jobs = {j["vm"]: j for j in run["jobs"]}
    out = {}
    for a in plan["actions"]:
        if a["action"] != "live-migrate":
            continue
        v, j = measured.get(a["vm"], {}), jobs.get(a["vm"], {})
        rep = j.get("report", {})
        stun = v.get("stun_ms")
        out[a["vm"]] = {
            "predicted_stun_ms": a["predicted_stun_ms"], "stun_ms": stun,
            "stun_error": round(stun / a["predicted_stun_ms"] - 1, 3) if stun and a["predicted_stun_ms"] else None,
            "plan_start_ms": a["start_ms"], "plan_end_ms": a["end_ms"],
            "start_ms": round(j["started_unix_ms"] - run["t0_unix_ms"]) if j.get("started_unix_ms") else None,
            "end_ms": round(j["ended_unix_ms"] - run["t0_unix_ms"]) if j.get("ended_unix_ms") else None,
            "final_bandwidth_bytes_per_s": a.get("final_bandwidth_bytes_per_s"),
            "final_shared_with": a.get("final_shared_with"),
            "rounds": len(rep.get("rounds", [])), "stop_reason": rep.get("stop_reason"),
        }
    return out


def median(sorted_values):
    n = len(sorted_values)
    if not n:
        return None
    return round(sorted_values[n // 2] if n % 2 else (sorted_values[n // 2 - 1] + sorted_values[n // 2]) / 2, 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gpumigrate")
    ap.add_argument("--rate", default="200mbit", help="every link, tc syntax (mbit or gbit)")
    ap.add_argument("--hosts", type=int, default=5)
    ap.add_argument("--dump", help="write the plans, reports and agents' job records to this file")
    args = ap.parse_args()
    why = cluster.available()
    if why:
        print(f"perf evacuate: skipped: {why}", file=sys.stderr)
        return 0
    binary = os.path.abspath(args.gpumigrate)
    tmp = tempfile.mkdtemp(prefix="gm-perf-evacuate-")
    try:
        env = dict(os.environ, GPUMIGRATE_CALIBRATION=f"{tmp}/calibration.json")
        estimates = {}
        for name, size, _, _ in VMS:  # what the planner is told: each sim's own estimate at this link
            r = subprocess.run([binary, "estimate", "--device", spec(size), "--link", rate_text(args.rate), "--json"],
                               capture_output=True, text=True, env=env, timeout=900)
            if r.returncode != 0:
                raise RuntimeError(f"estimate of {name}: {r.stderr[-1000:]}")
            estimates[name] = json.loads(r.stdout)
        wall, report, plan, run = run_fleet(binary, args.rate, args.hosts, estimates, [])
        bwall, breport, _, brun = run_fleet(binary, args.rate, args.hosts, estimates, ["--batched"])
        uwall, ureport, _, urun = run_fleet(binary, args.rate, args.hosts, estimates, ["--no-pace"])
        if args.dump:
            with open(args.dump, "w") as fo:
                json.dump({"plan": plan, "report": report, "run": run, "batched_report": breport,
                           "batched_run": brun, "unpaced_report": ureport, "unpaced_run": urun,
                           "estimates": estimates}, fo, indent=1)
        stun = {v["vm"]: v.get("stun_ms") for v in report["vms"]}
        vms = per_vm(plan, report, run)
        errors = sorted(abs(v["stun_error"]) for v in vms.values() if v["stun_error"] is not None)
        uvms = per_vm(plan, ureport, urun)
        uerrors = sorted(abs(v["stun_error"]) for v in uvms.values() if v["stun_error"] is not None)
        out = {
            "bench": "evacuate", "hosts": args.hosts, "vms": len(VMS), "rate": args.rate,
            "plan_total_ms": plan["total_ms"], "wall_ms": round(wall, 1),
            "wall_vs_plan": round(wall / plan["total_ms"], 3) if plan["total_ms"] else None,
            "plan_batched_total_ms": plan["batched_total_ms"], "batched_wall_ms": round(bwall, 1),
            "batched_wall_vs_plan": round(bwall / plan["batched_total_ms"], 3) if plan["batched_total_ms"] else None,
            "pipelined_vs_batched_wall": round(wall / bwall, 3),
            "predicted_stun_ms": {a["vm"]: a["predicted_stun_ms"] for a in plan["actions"]},
            "stun_ms": stun,
            "outcomes": sorted({v["outcome"] for v in report["vms"] + breport["vms"]}),
            "per_vm": vms, "batched_stun_ms": {v["vm"]: v.get("stun_ms") for v in breport["vms"]},
            "stun_error_median": median(errors),
            "stun_error_worst": errors[-1] if errors else None,
            "unpaced": {"wall_ms": round(uwall, 1),
                        "wall_vs_plan": round(uwall / plan["total_ms"], 3) if plan["total_ms"] else None,
                        "stun_ms": {v["vm"]: v.get("stun_ms") for v in ureport["vms"]},
                        "stun_error_median": median(uerrors), "stun_error_worst": uerrors[-1] if uerrors else None},
        }
        print(json.dumps(out))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
