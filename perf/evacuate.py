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
     (`evacuate --yes --batched`), wall time.
One JSON line: each wall time beside the plan's prediction for it, and the
pipelined run beside the batched one (its peer in the same run). Needs root.
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
        t0 = time.monotonic()
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--yes", "--json", "--store", f"{f.tmp}/store", *extra), timeout=900)
        wall_ms = (time.monotonic() - t0) * 1000
        if r.returncode != 0:
            raise RuntimeError(f"evacuate {' '.join(extra)} exited {r.returncode}: {r.stderr[-2000:]}")
        return wall_ms, json.loads(r.stdout), plan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gpumigrate")
    ap.add_argument("--rate", default="200mbit", help="every link, tc syntax (mbit or gbit)")
    ap.add_argument("--hosts", type=int, default=5)
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
        wall, report, plan = run_fleet(binary, args.rate, args.hosts, estimates, [])
        bwall, breport, _ = run_fleet(binary, args.rate, args.hosts, estimates, ["--batched"])
        stun = {v["vm"]: v.get("stun_ms") for v in report["vms"]}
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
        }
        print(json.dumps(out))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
