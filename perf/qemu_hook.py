#!/usr/bin/env python3
"""The QEMU hook's cost, beside QEMU migrating the same VM by itself, in one run.

One VM (tests/qemu/guest: main RAM as NUMA node 0, the "device memory" as node 1,
a share=on file under /dev/shm; tests/qemu/qemu_harness.py starts the pairs): each
guest pass checks and rewrites every page of both memories (RAM above 16 MiB),
then the guest idles --period-ms (in 10 ms ticks) before the next pass.
Each run starts a fresh source/destination pair and migrates it one of two ways:

  hook        what a user runs (README "A QEMU VM with device memory"):
              `gpumigrate receive --qemu DST.qmp --qemu-incoming unix:... --psk-file`
              and `gpumigrate migrate --qemu SRC.qmp --psk-file ... --json`, two
              processes over TLS with a PSK; QEMU moves node 0, the engine node 1.
  qemu_alone  the peer: QEMU 7.2 alone moves both nodes (no x-ignore-shared),
              caps events + return-path, the same max-bandwidth (1e12 B/s, what
              the hook sets when uncapped) and downtime-limit, no
              pause-before-switchover; `cont` on the destination once completed.

A run counts only when the destination guest's own check is clean: its passes
continue the source's count (it was not rebooted) with ram_bad=0 dev_bad=0.
A run that fails (or whose guest check fails) prints ok=false and its error,
and no figures; so does a QEMU-alone migration still not completed after
--timeout-s (then cancelled), and the exit status is 1. Sides alternate (hook, qemu_alone, hook, ...) so both see the
same machine. One JSON object per line, then a summary line with medians.

Figures (ms unless named otherwise):
  stun_ms            guest-visible stun: the source QEMU's STOP event to the
                     destination running (hook: the report's stun_ms, STOP to the
                     source learning the destination runs; qemu_alone: STOP to the
                     destination's RESUME event after `cont`, QMP timestamps)
  device_stun_ms     hook: the engine's own stun (its final device round)
  qemu_downtime_ms   QEMU's `downtime` (hook: it includes the pre-switchover pause)
  wall_ms            start of the migration to the destination running (hook:
                     `migrate` started to both CLI processes exited, after `cont`)
  bytes              hook: engine bytes_sent + QEMU ram transferred; qemu_alone: ram transferred
  floor_ms           the stun's floor, what was left to send at the stop over the
                     rate measured before it: hook, the engine's final-round bytes
                     over its pre-copy bandwidth; qemu_alone, QEMU's downtime-bytes
                     over its mbps (at completion, QEMU 7.2's mbps is its average
                     over the whole migration). Both rates are measured while the
                     guest runs; final_round_bytes_per_s / downtime_bytes_per_s are
                     the rates reached while it is stopped, beside them: on a small
                     TCG host the vCPU thread competes with the copy, so the stopped
                     phase can run faster and the "floor" is then no lower bound
  paused_on_its_own, stopped_before_switchover_ms   hook: from the report's `qemu`
                     object (QEMU 7.2 paused the guest by itself before the engine asked)

  perf/qemu_hook.py GPUMIGRATE GUEST_ELF [--ram-mb 256] [--dev-mb 256] [--guest-ram-mb N]
                    [--period-ms 50] [--runs 2] [--downtime-ms 300] [--timeout-s 150]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "qemu"))
import qemu_harness as h  # noqa: E402

BENCH = "qemu_hook"
UNCAPPED_BYTES_PER_S = int(1e12)  # the hook's max-bandwidth when `migrate` has no --bandwidth


class RunFailed(Exception):
    pass


def r1(v):
    return round(v, 1) if isinstance(v, float) else v


def event_unix_s(ev):
    ts = ev.get("timestamp", {})
    return ts.get("seconds", 0) + ts.get("microseconds", 0) / 1e6


def check_destination(pair, timeout_s):
    """The destination guest continued the source's pass count with clean passes; returns its passes."""
    src_passes = pair.src.passes()
    if not src_passes or not all(p["ram_bad"] == 0 and p["dev_bad"] == 0 for p in src_passes):
        raise RunFailed(f"source guest passes not clean before the switchover: {src_passes[-3:]}")
    last_src = src_passes[-1]["pass"]
    try:
        pair.dst.wait_pass(last_src + 2, timeout_s=timeout_s)
    except h.HarnessError as e:
        raise RunFailed(f"destination guest check: {e}") from None
    if "GUEST-START" in pair.dst.console_text():
        raise RunFailed("the destination guest booted instead of continuing")
    dst = pair.dst.passes()
    bad = [p for p in dst if p["ram_bad"] or p["dev_bad"]]
    if bad or dst[0]["pass"] < last_src:
        raise RunFailed(f"destination guest check failed: source ended at pass {last_src}, destination {dst[:4]}")
    return {"dst_passes_checked": len(dst), "ram_bad": 0, "dev_bad": 0}


def run_hook(pair, args, gm):
    d = pair.workdir
    psk = os.path.join(d, "psk")
    with open(psk, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    port_file = os.path.join(d, "port")
    procs = []
    outs = {}
    try:
        for side in ("rx", "tx"):
            outs[side] = (open(os.path.join(d, f"{side}.json"), "w+"), open(os.path.join(d, f"{side}.err"), "w+"))
        rx = subprocess.Popen([gm, "receive", "--listen", "127.0.0.1:0", "--port-file", port_file,
                               "--device", f"shm:{pair.dst.dev_path}", "--qemu", pair.dst.qmp_path,
                               "--qemu-incoming", pair.uri, "--psk-file", psk, "--accept-timeout", "60s", "--json"],
                              stdout=outs["rx"][0], stderr=outs["rx"][1])
        procs.append(rx)
        deadline = time.monotonic() + 20
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if rx.poll() is not None or time.monotonic() > deadline:
                raise RunFailed(f"receiver did not start: {tail(outs['rx'][1])}")
            time.sleep(0.02)
        port = int(open(port_file).read())
        t0 = time.monotonic()
        tx = subprocess.Popen([gm, "migrate", "--to", f"127.0.0.1:{port}", "--device", f"shm:{pair.src.dev_path}",
                               "--qemu", pair.src.qmp_path, "--psk-file", psk, "--warmup", "10ms",
                               "--downtime-target", f"{args.downtime_ms}ms", "--json"],
                              stdout=outs["tx"][0], stderr=outs["tx"][1])
        procs.append(tx)
        rcs = {}
        for side, p in (("tx", tx), ("rx", rx)):
            try:
                rcs[side] = p.wait(timeout=max(1, args.timeout_s - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                raise RunFailed(f"{'migrate' if side == 'tx' else 'receive'} still running after {args.timeout_s} s: "
                                f"{tail(outs[side][1])}") from None
        wall_ms = (time.monotonic() - t0) * 1e3
        src, dst = report(outs["tx"][0]), report(outs["rx"][0])
        for side, rep, name in (("tx", src, "migrate"), ("rx", dst, "receive")):
            if rcs[side] != 0 or rep.get("outcome") != "completed":
                raise RunFailed(f"{name} exited {rcs[side]}, outcome {rep.get('outcome')}: "
                                f"{rep.get('error') or tail(outs[side][1])}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in (f for pair_ in outs.values() for f in pair_):
            f.close()
    q = src.get("qemu", {})
    if q.get("migration_status") != "completed" or dst.get("qemu", {}).get("run_state") != "running":
        raise RunFailed(f"QEMU: source {q.get('migration_status')}, destination {dst.get('qemu', {}).get('run_state')}")
    guest = check_destination(pair, args.check_timeout_s)
    final = [r for r in src["rounds"] if r["final"]]
    final_bytes = sum(r["bytes"] for r in final)
    bw = src["bandwidth_bytes_per_s"]
    return {"stun_ms": r1(src["stun_ms"]), "device_stun_ms": r1(src["device_stun_ms"]),
            "qemu_downtime_ms": r1(q.get("qemu_downtime_ms")), "wall_ms": round(wall_ms, 1),
            "engine_total_ms": r1(src["total_ms"]), "qemu_total_ms": r1(q.get("qemu_total_ms")),
            "bytes": src["bytes_sent"] + q.get("ram_transferred_bytes", 0), "engine_bytes": src["bytes_sent"],
            "qemu_ram_bytes": q.get("ram_transferred_bytes", 0), "rounds": len(src["rounds"]),
            "round_ms": [r["ms"] for r in src["rounds"] if not r["final"]],
            "final_round_bytes": final_bytes, "engine_bytes_per_s": round(bw),
            "final_round_bytes_per_s": round(final_bytes / (sum(r["ms"] for r in final) / 1e3))
            if final and sum(r["ms"] for r in final) > 0 else None,
            "floor_ms": round(final_bytes / bw * 1e3, 1) if bw > 0 else None,
            "floor": "engine final-round bytes / engine pre-copy bandwidth",
            "predicted_stun_ms": src.get("predicted_stun_ms"), "switchover_reason": src.get("switchover_reason"),
            "paused_on_its_own": q.get("paused_on_its_own"),
            "stopped_before_switchover_ms": r1(q.get("stopped_before_switchover_ms")),
            "converge_wait_ms": r1(q.get("converge_wait_ms")),
            "ram_remaining_at_pause_bytes": q.get("ram_remaining_at_pause_bytes"),
            "ram_finish_wait_ms": r1(q.get("ram_finish_wait_ms")), "stun_breakdown_ms": src.get("stun_breakdown_ms"),
            **guest}


def run_qemu_alone(pair, args):
    src, dst = pair.src.qmp, pair.dst.qmp
    caps = {"capabilities": [{"capability": c, "state": True} for c in ("events", "return-path")]}
    src.execute("migrate-set-capabilities", caps)
    dst.execute("migrate-set-capabilities", caps)
    src.execute("migrate-set-parameters", {"max-bandwidth": UNCAPPED_BYTES_PER_S, "downtime-limit": args.downtime_ms})
    dst.execute("migrate-incoming", {"uri": pair.uri})
    t0 = time.monotonic()
    src.execute("migrate", {"uri": pair.uri})
    try:
        ev = src.wait_event("MIGRATION", lambda e: e["status"] in ("completed", "failed", "cancelled"),
                            timeout_s=args.timeout_s)
    except h.HarnessError:
        info = src.execute("query-migrate")
        src.execute("migrate_cancel")
        raise RunFailed(f"QEMU did not complete in {args.timeout_s} s (downtime-limit {args.downtime_ms} ms; "
                        f"expected-downtime {info.get('expected-downtime')} ms, "
                        f"dirty-sync-count {info.get('ram', {}).get('dirty-sync-count')})") from None
    info = src.execute("query-migrate")
    if ev["data"]["status"] != "completed":
        raise RunFailed(f"QEMU migration {ev['data']['status']}: {info.get('error-desc', '')}")
    stop = src.wait_event("STOP", timeout_s=5)
    dst.wait_event("MIGRATION", lambda e: e["status"] == "completed", timeout_s=30)
    dst.execute("cont")
    resume = dst.wait_event("RESUME", timeout_s=10)
    wall_ms = (time.monotonic() - t0) * 1e3
    guest = check_destination(pair, args.check_timeout_s)
    ram = info["ram"]
    rate = ram["mbps"] * 1e6 / 8
    return {"stun_ms": round((event_unix_s(resume) - event_unix_s(stop)) * 1e3, 1),
            "qemu_downtime_ms": info.get("downtime"), "wall_ms": round(wall_ms, 1),
            "qemu_total_ms": info.get("total-time"), "bytes": ram["transferred"],
            "downtime_bytes": ram.get("downtime-bytes"), "qemu_bytes_per_s": round(rate),
            "downtime_bytes_per_s": round(ram.get("downtime-bytes", 0) / (info["downtime"] / 1e3))
            if info.get("downtime") else None,
            "floor_ms": round(ram.get("downtime-bytes", 0) / rate * 1e3, 1) if rate > 0 else None,
            "floor": "QEMU downtime-bytes / its mbps",
            "dirty_sync_count": ram.get("dirty-sync-count"), "ram_total_bytes": ram.get("total"), **guest}


def report(f):
    f.seek(0)
    lines = f.read().strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {"unparsed": lines[-1][:500]}


def tail(f, n=600):
    f.seek(0)
    return " | ".join(f.read()[-n:].strip().splitlines())


def one_run(side, i, args, gm, workdir):
    rundir = os.path.join(workdir, f"{side}-{i}")
    out = {"bench": BENCH, "side": side, "run": i, "ram_mib": args.ram_mb, "dev_mib": args.dev_mb,
           "guest_ram_mib": args.guest_ram_mb, "guest_period_ms": args.period_ms,
           "downtime_limit_ms": args.downtime_ms}
    try:
        with h.Pair(rundir, args.guest, ram_mb=args.ram_mb, dev_mb=args.dev_mb, guest_ram_mb=args.guest_ram_mb,
                    period=max(1, args.period_ms // 10)) as pair:
            out["accel"] = pair.accel
            pair.start()
            pair.src.wait_pass(2, timeout_s=60)
            figures = run_hook(pair, args, gm) if side == "hook" else run_qemu_alone(pair, args)
            out.update(ok=True, **figures)
    except (RunFailed, h.HarnessError) as e:
        out.update(ok=False, error=str(e))
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return out


def median(runs, key):
    vals = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return round(statistics.median(vals), 1) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpumigrate")
    ap.add_argument("guest")
    ap.add_argument("--ram-mb", type=int, default=256, help="guest main RAM (NUMA node 0), MiB")
    ap.add_argument("--dev-mb", type=int, default=256, help="device memory (node 1, an shm file), MiB")
    ap.add_argument("--guest-ram-mb", type=int, help="RAM the guest rewrites each pass (default: all above 16 MiB)")
    ap.add_argument("--period-ms", type=int, default=50, help="the guest idles this long between passes (10 ms ticks)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each side")
    ap.add_argument("--downtime-ms", type=int, default=300, help="QEMU downtime-limit and the engine's target")
    ap.add_argument("--timeout-s", type=float, default=150, help="per migration")
    ap.add_argument("--check-timeout-s", type=float, default=60, help="for the destination guest's passes")
    args = ap.parse_args()
    if args.guest_ram_mb is None:
        args.guest_ram_mb = args.ram_mb - 16
    if not shutil.which(h.QEMU):
        msg = f"{h.QEMU} not found (scripts/bootstrap installs qemu-system-x86)"
        print(f"perf/qemu_hook.py: skipped: {msg}", file=sys.stderr)
        print(json.dumps({"bench": BENCH, "skipped": msg}))
        return 0
    if not os.path.exists(args.guest):
        msg = f"no test guest at {args.guest} (the C compiler cannot emit freestanding -m32 code?)"
        print(f"perf/qemu_hook.py: skipped: {msg}", file=sys.stderr)
        print(json.dumps({"bench": BENCH, "skipped": msg}))
        return 0
    h.install_cleanup_on_signals()
    workdir = tempfile.mkdtemp(prefix="gm-perf-qemu-hook-")
    results = {"hook": [], "qemu_alone": []}
    try:
        for i in range(1, args.runs + 1):
            for side in ("hook", "qemu_alone"):
                results[side].append(one_run(side, i, args, os.path.abspath(args.gpumigrate), workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary = {"bench": BENCH, "summary": True, "runs": args.runs, "ram_mib": args.ram_mb, "dev_mib": args.dev_mb,
               "guest_ram_mib": args.guest_ram_mb, "guest_period_ms": args.period_ms,
               "accel": next((r["accel"] for v in results.values() for r in v if "accel" in r), None)}
    keys = {"hook": ("stun_ms", "device_stun_ms", "qemu_downtime_ms", "floor_ms", "wall_ms", "bytes",
                     "stopped_before_switchover_ms"),
            "qemu_alone": ("stun_ms", "qemu_downtime_ms", "floor_ms", "wall_ms", "bytes")}
    for side, runs in results.items():
        good = [r for r in runs if r.get("ok")]
        s = {"ok_runs": len(good), "failed_runs": len(runs) - len(good)}
        s.update({f"median_{k}": median(good, k) for k in keys[side]})
        if side == "hook":
            s["paused_on_its_own_runs"] = sum(1 for r in good if r.get("paused_on_its_own"))
        summary[side] = s
    hk, qa = summary["hook"], summary["qemu_alone"]
    for k in ("stun_ms", "wall_ms", "bytes"):
        a, b = hk[f"median_{k}"], qa[f"median_{k}"]
        summary[f"hook_over_qemu_alone_{k.removesuffix('_ms')}"] = round(a / b, 2) if a and b else None
    print(json.dumps(summary), flush=True)
    return 0 if hk["failed_runs"] == 0 and qa["failed_runs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
