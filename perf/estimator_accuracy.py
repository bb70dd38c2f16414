#!/usr/bin/env python3
"""How well `gpumigrate estimate` predicts the stun that `gpumigrate migrate` then
measures, on the path users run (issue 15): for each workload, `estimate` observes
the running source (its dry run, over the path calibration of that workload's
transport, streams, codec and cap), then the same device spec is migrated with
`migrate`/`receive` as two processes over loopback PSK TLS with the same cap,
codec and downtime target, and the prediction is compared with the report.

  perf/estimator_accuracy.py GPUMIGRATE GPUMIGRATE_WORKLOAD [--only N[,N...]] [--repeat K]
                             [--sample DURATION] [--keep-calibration] [--guest GUEST_ELF]

The calibration (in-process and per path) starts empty in a temporary directory,
so every path is measured within the run, as a first-time user's would be
(--keep-calibration uses the caller's $GPUMIGRATE_CALIBRATION instead).
Workloads: sim devices (256 MiB-2 GiB, static 0.5-0.95, KV append 4-128 MiB/s,
hot sets 4-96 MiB, caps 200 MB/s-1 GB/s and uncapped, codecs none, zstd, shuffle
and auto, 2 and 4 streams, some built to sit near the 300 ms target), proc
devices (a gpumigrate-workload process written at a set rate, tracked by the real
kernel tracker: at random over all its memory, within a hot set, as a
sequential sweep, and in bursts) and QEMU VMs (the test guest of tests/qemu,
its RAM beside shm device memory: `estimate --qemu`, then `migrate`/`receive
--qemu` as perf/qemu_hook.py runs them; measured is the guest-visible stun;
--guest GUEST_ELF, skipped without it or without qemu-system-x86_64). None of
them is the path calibration's own device.

One JSON object per workload (predicted and measured stun, error =
predicted/measured - 1, whether the measured stun lies in the printed range,
rounds, the host's spread the range was widened by), then a summary: median and
worst absolute stun error, ranges held, the workloads within issue 40's goal
(25% or 25 ms, whichever is larger) and those beyond it, and how often the
predicted rounds are the engine's."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import proc_workload

# name, device (sim spec, proc:SIZE:RATE[:PATTERN] or qemu:RAM:DEV:PERIOD:EVERY), cap ("" = uncapped), codec,
# streams, downtime target
WORKLOADS = [
    ("sim-512M-kv16-uncapped", "sim:size=512MiB,static=0.8,kv=0.15,kv_fill=0.3,kv_rate=16MiB/s,hot=8MiB,page=64KiB,step=10ms", "", "none", 2, "300ms"),
    ("sim-1G-static95-cap1G", "sim:size=1GiB,static=0.95,kv=0.04,kv_fill=0.2,kv_rate=4MiB/s,hot=4MiB,page=64KiB,step=20ms", "1GB/s", "none", 2, "300ms"),
    ("sim-256M-static50-cap256M", "sim:size=256MiB,static=0.5,kv=0.4,kv_fill=0.3,kv_rate=64MiB/s,hot=16MiB,page=16KiB,step=5ms", "256MB/s", "none", 2, "300ms"),
    ("sim-768M-hot32-cap512M", "sim:size=768MiB,static=0.7,kv=0.2,kv_fill=0.5,kv_rate=32MiB/s,hot=32MiB,page=64KiB,step=10ms", "512MB/s", "none", 2, "300ms"),
    ("sim-512M-zstd-uncapped", "sim:size=512MiB,static=0.9,kv=0.05,kv_fill=0.5,kv_rate=8MiB/s,hot=24MiB,page=64KiB,step=10ms", "", "zstd", 2, "300ms"),
    ("sim-1G-zstd-cap400M", "sim:size=1GiB,static=0.6,kv=0.3,kv_fill=0.4,kv_rate=48MiB/s,hot=12MiB,page=64KiB,step=20ms", "400MB/s", "zstd", 2, "300ms"),
    ("sim-384M-hot20-cap200M", "sim:size=384MiB,static=0.75,kv=0.2,kv_fill=0.5,kv_rate=24MiB/s,hot=20MiB,page=64KiB,step=10ms", "200MB/s", "none", 2, "300ms"),
    ("sim-near-target-hot64-cap256M", "sim:size=512MiB,static=0.8,kv=0.1,kv_fill=1,kv_rate=0,hot=64MiB,page=64KiB,step=5ms", "256MB/s", "none", 2, "300ms"),
    ("sim-near-target-hot96-cap400M", "sim:size=640MiB,static=0.8,kv=0.05,kv_fill=1,kv_rate=0,hot=96MiB,page=64KiB,step=5ms", "400MB/s", "none", 2, "300ms"),
    ("sim-640M-kv96-cap768M", "sim:size=640MiB,static=0.85,kv=0.1,kv_fill=0.2,kv_rate=96MiB/s,hot=8MiB,page=64KiB,step=10ms", "768MB/s", "none", 2, "300ms"),
    ("sim-2G-static90-uncapped", "sim:size=2GiB,static=0.9,kv=0.08,kv_fill=0.3,kv_rate=16MiB/s,hot=16MiB,page=64KiB,step=20ms", "", "none", 2, "300ms"),
    ("sim-320M-kv128-cap300M", "sim:size=320MiB,static=0.6,kv=0.35,kv_fill=0.2,kv_rate=128MiB/s,hot=4MiB,page=16KiB,step=5ms", "300MB/s", "none", 2, "300ms"),
    ("sim-512M-shuffle-cap300M", "sim:size=512MiB,static=0.8,kv=0.15,kv_fill=0.5,kv_rate=16MiB/s,hot=8MiB,page=64KiB,step=10ms", "300MB/s", "shuffle", 2, "300ms"),
    ("sim-512M-auto-cap200M", "sim:size=512MiB,static=0.85,kv=0.1,kv_fill=0.5,kv_rate=12MiB/s,hot=8MiB,page=64KiB,step=10ms", "200MB/s", "auto", 2, "300ms"),
    ("sim-768M-4streams-uncapped", "sim:size=768MiB,static=0.7,kv=0.25,kv_fill=0.4,kv_rate=32MiB/s,hot=12MiB,page=64KiB,step=10ms", "", "none", 4, "300ms"),
    ("sim-512M-target100ms-cap512M", "sim:size=512MiB,static=0.85,kv=0.1,kv_fill=0.5,kv_rate=24MiB/s,hot=16MiB,page=64KiB,step=10ms", "512MB/s", "none", 2, "100ms"),
    ("proc-256M-20MBps-uncapped", "proc:256MiB:20MB/s", "", "none", 2, "300ms"),
    ("proc-512M-50MBps-cap300M", "proc:512MiB:50MB/s", "300MB/s", "none", 2, "300ms"),
    ("proc-384M-8MBps-cap1G", "proc:384MiB:8MB/s", "1GB/s", "none", 2, "300ms"),
    ("proc-384M-hot5pct-60MBps-uncapped", "proc:384MiB:60MB/s:hot=0.05", "", "none", 2, "300ms"),
    ("proc-256M-sequential-30MBps-cap500M", "proc:256MiB:30MB/s:sequential", "500MB/s", "none", 2, "300ms"),
    ("proc-384M-bursty-80MBps-cap400M", "proc:384MiB:80MB/s:burst=300ms/700ms", "400MB/s", "none", 2, "300ms"),
    # QEMU VMs (tests/qemu/guest): RAM MiB, device memory MiB, guest period ms, every Nth page rewritten
    ("qemu-256M+256M-period50", "qemu:256:256:50:1", "", "none", 2, "300ms"),
    ("qemu-192M+128M-period20-every4", "qemu:192:128:20:4", "", "none", 2, "300ms"),
]


def within_goal(r):
    """Whether a workload's predicted stun is within 25% or 25 ms of the measured one."""
    off = abs(r["predicted_stun_ms"] - r["measured_stun_ms"])
    return off <= max(0.25 * r["measured_stun_ms"], 25.0)


def parse_args(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    opts = {"gm": argv[1], "wl": argv[2], "only": None, "repeat": 1, "sample": "1s", "keep": False, "guest": None}
    i = 3
    while i < len(argv):
        k = argv[i]
        if k == "--keep-calibration":
            opts["keep"] = True
            i += 1
            continue
        if i + 1 >= len(argv):
            sys.exit(f"{k} needs a value\n{__doc__}")
        v = argv[i + 1]
        if k == "--only":
            opts["only"] = {int(x) for x in v.split(",")}
        elif k == "--repeat":
            opts["repeat"] = int(v)
        elif k == "--sample":
            opts["sample"] = v
        elif k == "--guest":
            opts["guest"] = os.path.abspath(v)
        else:
            sys.exit(f"unknown option {k}\n{__doc__}")
        i += 2
    return opts


class Skipped(Exception):
    pass


def qemu_harness():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "qemu"))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import qemu_harness as h
    return h


class Bench:
    def __init__(self, opts):
        self.gm, self.wl = opts["gm"], opts["wl"]
        self.guest = opts["guest"]
        self.sample = opts["sample"]
        self.work = tempfile.mkdtemp(prefix="gm-estacc-")
        self.env = dict(os.environ, GPUMIGRATE_SHIM_DIR=self.work)
        if not opts["keep"]:
            self.env["GPUMIGRATE_CALIBRATION"] = os.path.join(self.work, "cal.json")
        self.psk = os.path.join(self.work, "psk")
        with open(self.psk, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(self.psk, 0o600)
        self.procs = []

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    def spawn(self, args):
        p = subprocess.Popen(args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def workload(self, size, rate, adopt=False, pattern=""):
        return proc_workload.start(self.wl, self.env, self.work, size, rate, adopt, self.procs,
                                   ["--adopt-timeout", "300s"], pattern)

    def estimate(self, device, cap, codec, streams, target, extra=()):
        args = [self.gm, "estimate", "--device", device, "--sample", self.sample, "--warmup", "500ms", "--json",
                "--codec", codec, "--downtime-target", target, "--transport", "tls"] + list(extra)
        if streams != 2:
            args += ["--streams", str(streams)]
        if cap:
            args += ["--link", cap]
        r = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"estimate {device}: exit {r.returncode}: {r.stderr[-1500:]}")
        return json.loads(r.stdout)

    def migrate(self, src_device, dst_device, cap, codec, streams, target):
        port_file = os.path.join(self.work, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        tls = ["--psk-file", self.psk]
        recv = self.spawn([self.gm, "receive", "--listen", "127.0.0.1:0", "--port-file", port_file, "--device",
                           dst_device, "--accept-timeout", "120s", "--json"] + tls)
        port = ""
        for _ in range(600):
            if os.path.exists(port_file):
                port = open(port_file).read().strip()
                if port:
                    break
            time.sleep(0.05)
        if not port:
            raise RuntimeError(f"receive never listened: {recv.stderr.read()[-800:]}")
        args = [self.gm, "migrate", "--to", f"127.0.0.1:{port}", "--device", src_device, "--streams", str(streams),
                "--codec", codec, "--downtime-target", target, "--warmup", "500ms", "--json"] + tls
        if cap:
            args += ["--bandwidth", cap]
        r = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=900)
        try:
            recv.wait(timeout=120)
        except subprocess.TimeoutExpired:
            recv.kill()
        if r.returncode != 0:
            raise RuntimeError(f"migrate {src_device}: exit {r.returncode}: {r.stdout[-1000:]} {r.stderr[-1000:]}")
        return json.loads(r.stdout)

    def qemu(self, device, codec, streams, target):
        """A QEMU VM (the test guest) estimated with --qemu, then migrated with the hook as
        perf/qemu_hook.py does (migrate/receive --qemu over PSK TLS); the measured stun is the
        guest-visible one, the prediction the estimate's."""
        if codec != "none" or streams != 2:
            raise RuntimeError("QEMU workloads run with the hook's defaults (no codec, 2 streams)")
        if not self.guest or not os.path.exists(self.guest) or not shutil.which(qemu_harness().QEMU):
            raise Skipped("no qemu-system-x86_64 or no test guest (--guest GUEST_ELF)")
        h = qemu_harness()
        import qemu_hook
        _, ram, dev, period, every = device.split(":")
        rundir = os.path.join(self.work, f"qemu-{time.monotonic_ns()}")
        args = argparse.Namespace(downtime_ms=int(target.rstrip("ms")), timeout_s=240, check_timeout_s=90)
        try:
            with h.Pair(rundir, self.guest, ram_mb=int(ram), dev_mb=int(dev), guest_ram_mb=int(ram) - 16,
                        period=max(1, int(period) // 10), every=int(every)) as pair:
                pair.start()
                pair.src.wait_pass(2, timeout_s=90)
                est = self.estimate(f"shm:{pair.src.dev_path}", "", codec, streams, target,
                                    ["--qemu", pair.src.qmp_path, "--qemu-dirty-sample", "1s"])
                fig = qemu_hook.run_hook(pair, args, self.gm)
        except (h.HarnessError, qemu_hook.RunFailed) as e:
            raise RuntimeError(f"QEMU: {e}") from None
        finally:
            shutil.rmtree(rundir, ignore_errors=True)
        est["predicted_stun_ms"] = est["qemu"]["guest_stun_ms"]
        rep = {"stun_ms": fig["stun_ms"], "outcome": "completed", "total_ms": fig["engine_total_ms"],
               "rounds": [{"final": False, "bytes": 0, "ms": ms} for ms in fig["round_ms"]] +
                         [{"final": True, "bytes": fig["final_round_bytes"], "ms": 1}],
               "converge_wait_ms": fig.get("converge_wait_ms"),
               "round0_bytes_per_s": fig["engine_bytes_per_s"], "stun_breakdown_ms": fig.get("stun_breakdown_ms"),
               "accel": pair.accel, "qemu_downtime_ms": fig.get("qemu_downtime_ms")}
        return est, rep

    def one(self, index, w):
        name, device, cap, codec, streams, target = w
        procs = []
        if device.startswith("qemu:"):
            est, rep = self.qemu(device, codec, streams, target)
        elif device.startswith("proc:"):
            _, size, rate, *pattern = device.split(":", 3)
            pattern = pattern[0] if pattern else ""
            src = self.workload(size, rate, pattern=pattern)
            procs.append(src)
            est = self.estimate(f"proc:{src.pid}", cap, codec, streams, target)
            dst = self.workload(size, rate, adopt=True, pattern=pattern)
            procs.append(dst)
            rep = self.migrate(f"proc:{src.pid}", f"proc:{dst.pid}", cap, codec, streams, target)
        else:
            est = self.estimate(device, cap, codec, streams, target)
            rep = self.migrate(device, device, cap, codec, streams, target)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        pred = est["predicted_stun_ms"]
        lo, hi = est["predicted_stun_range_ms"]
        meas = rep["stun_ms"]
        measured_rounds = sum(1 for r in rep["rounds"] if not r.get("final"))
        out = {
            "workload": index,
            "name": name,
            "device": device,
            "cap": cap or "uncapped",
            "codec": codec,
            "streams": streams,
            "downtime_target": target,
            "predicted_decision": est["decision"],
            "measured_outcome": rep["outcome"],
            "predicted_stun_ms": None if pred is None else round(pred, 2),
            "predicted_stun_range_ms": [None if x is None else round(x, 2) for x in (lo, hi)],
            "measured_stun_ms": meas,
            "stun_error": None if not pred or not meas else round(pred / meas - 1, 4),
            "range_held": None if lo is None or hi is None else lo <= meas <= hi,
            "marginal": est.get("marginal", False),
            # the engine's rounds: those before its rule said go, and for a QEMU VM the
            # rounds it runs while the switchover is held for QEMU's pause
            "predicted_rounds": len(est["predicted_rounds"]) +
                                ((est.get("beside") or {}).get("predicted") or {}).get("held_rounds", 0),
            "measured_rounds": measured_rounds,
            "predicted_round0_bytes_per_s": round(est["bandwidth_bytes_per_s"]["mid"]),
            "measured_round0_bytes_per_s": rep.get("round0_bytes_per_s") or
                                           round(rep["rounds"][0]["bytes"] / (rep["rounds"][0]["ms"] / 1e3)),
            "predicted_total_ms": None if est["predicted_total_ms"] is None else round(est["predicted_total_ms"], 1),
            "measured_total_ms": rep["total_ms"],
            "predicted_final_bytes": est.get("predicted_final_bytes"),
            "measured_final_bytes": sum(r["bytes"] for r in rep["rounds"] if r.get("final")),
            "measured_stun_breakdown_ms": rep.get("stun_breakdown_ms"),
            "predicted_round_ms": [round(r["ms"], 1) for r in est["predicted_rounds"]],
            "measured_round_ms": [round(r["ms"], 1) for r in rep["rounds"] if not r.get("final")],
            "path": est.get("path_calibration", {}).get("key"),
            "host_spread": est.get("path_calibration", {}).get("spread"),
            "dry_run_sync_ms": est.get("dirty_sync_ms"),
            "sync_extra_ms": est.get("path_calibration", {}).get("sync_extra_ms"),
        }
        if device.startswith("qemu:"):
            out["predicted_converge_ms"] = ((est.get("beside") or {}).get("predicted") or {}).get("converge_ms")
            out["measured_converge_ms"] = rep.get("converge_wait_ms")
            out["measured_stun"] = "guest-visible (the hook's stun_ms: the source's STOP to the destination running)"
            out["accel"] = rep["accel"]
            out["qemu_downtime_ms"] = rep["qemu_downtime_ms"]
        print(json.dumps(out), flush=True)
        return out


def main():
    opts = parse_args(sys.argv)
    b = Bench(opts)
    results = []
    try:
        for rep in range(opts["repeat"]):
            for i, w in enumerate(WORKLOADS):
                if opts["only"] is not None and i not in opts["only"]:
                    continue
                try:
                    results.append(b.one(i, w))
                except Skipped as e:
                    print(json.dumps({"workload": i, "name": w[0], "skipped": str(e)}), flush=True)
                except Exception as e:  # one failed workload is reported, the rest still run
                    print(json.dumps({"workload": i, "name": w[0], "error": str(e)[-2000:]}), flush=True)
                    results.append({"workload": i, "name": w[0], "error": str(e)})
    finally:
        b.close()
    ok = [r for r in results if "error" not in r and r.get("predicted_stun_ms") and r.get("measured_stun_ms")]
    errs = [abs(r["stun_error"]) for r in results if r.get("stun_error") is not None]
    held = [r["range_held"] for r in results if r.get("range_held") is not None]
    summary = {
        "summary": "estimator_accuracy",
        "path": "estimate, then migrate/receive as two processes over loopback PSK TLS",
        "workloads": len(results),
        "failed": sum(1 for r in results if "error" in r),
        "compared": len(errs),
        "median_abs_stun_error": round(statistics.median(errs), 4) if errs else None,
        "worst_abs_stun_error": round(max(errs), 4) if errs else None,
        "ranges_held": sum(1 for h in held if h),
        "ranges_compared": len(held),
        "decisions_agree": sum(1 for r in results if "error" not in r and
                               (r["predicted_decision"] == "live-migrate") == (r["measured_outcome"] == "completed")),
        # Issue 40's goal: each error within 25% or 25 ms, whichever is larger
        # (below 100 ms the run-to-run spread on two shared cores is itself tens of ms).
        "within_goal": sum(1 for r in ok if within_goal(r)),
        "beyond_goal": [r["name"] for r in ok if not within_goal(r)],
        "rounds_agree": sum(1 for r in ok if r["predicted_rounds"] == r["measured_rounds"]),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
