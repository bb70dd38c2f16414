#!/usr/bin/env python3
"""Soak (issue 16): migrations between two real processes for a given time, with
random faults from tests/support/fault_proxy.py between them and random SIGKILLs
of either side, every outcome checked, and a tally at the end.

Usage:
  soak.py --gm PATH/TO/gpumigrate --duration SECONDS [--seed N] [--out TALLY.json]
          [--keep DIR]

Each iteration: a `receive` (sim device), the proxy with one fault drawn at random
(or none), a `migrate` of the same sim spec through the proxy over PSK TLS, with
short liveness limits and a resume window, and in some iterations a SIGKILL of
migrate or receive at a random moment. Sides "back and forth": the iteration's
direction alternates, which with sim devices only changes which port is which,
but keeps both roles equally exercised. Outcomes, judged from both exit codes and
both JSON reports:

  completed    both exit 0, the source verified, the destination ran and passed its
               self-check (receive exits 0 only then), no resumption
  resumed      as completed, after at least one resumption
  rolled_back  the source rolled back with its device RUNNING (exit 1), the
               destination discarded (exit 1) or was the one killed
  in_doubt     a side reports in doubt (exit 3), both stopped, the other did not
               complete on its own while the source ran on
  killed       the source process was SIGKILLed (a sim device dies with it): the
               receiver must end (0 only if it had already been committed, else 1)
  lost         anything else: a hang (a `timeout` fired), a split brain (the source
               runs on and the destination runs too), a completion that was not
               verified, a missing report from a side that was not killed, or a
               sanitizer report in a side's stderr. Must be 0.

Only 127.0.0.1. Every process is bounded by `timeout`; the proxy by --seconds.
Exit status: 0 when nothing was lost, 1 otherwise.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.path.join(HERE, "..", "support", "fault_proxy.py")
LIVE = ["--peer-timeout", "4s", "--peer-silence-timeout", "3s", "--keepalive-interval", "250ms",
        "--resume-window", "8s"]
BOUND = 90  # seconds: any process still running after this is a hang


def draw_fault(rng):
    """One fault for the proxy (or none), as proxy arguments, and its name."""
    kind = rng.choice(["none", "none", "blackhole", "stall", "reset", "reset", "truncate", "duplicate", "delay",
                       "reorder", "rate"])
    if kind == "none":
        return "none", []
    after = ["--after-bytes", str(rng.randint(0, 48 << 20))] if rng.random() < 0.6 else \
        ["--after-seconds", f"{rng.uniform(0.1, 3.0):.2f}"]
    if kind == "blackhole":
        conn = rng.choice(["0", "1", "all"])
        return f"blackhole:{conn}", ["--fault", "blackhole", "--conn", conn] + after
    if kind == "stall":
        return "stall:1", ["--fault", "stall", "--conn", "1"] + after
    if kind == "reset":
        conn = rng.choice(["0", "1", "2"])
        return f"reset:{conn}", ["--fault", "reset", "--conn", conn] + after
    if kind == "truncate":
        return "truncate:0", ["--fault", "truncate", "--conn", "0"] + after
    if kind == "duplicate":
        return "duplicate:1", ["--fault", "duplicate", "--conn", "1"] + after
    if kind == "delay":
        return "delay:all", ["--fault", "delay", "--conn", "all", "--delay-ms", str(rng.randint(1, 20)),
                             "--jitter-ms", str(rng.randint(0, 20)), "--seed", str(rng.randint(0, 1 << 30))]
    if kind == "reorder":
        return "reorder:1", ["--fault", "reorder", "--conn", "1", "--delay-ms", str(rng.randint(5, 60))]
    return "rate:data", ["--fault", "rate", "--conn", "data", "--rate", str(rng.randint(4, 40) * 1000000)] + after


def wait_file(path, proc, seconds=15):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return f.read().strip()
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def report(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return json.loads(text.splitlines()[-1]) if text else None
    except (OSError, ValueError):
        return None


def sanitizer_report(path):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    for needle in ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer"):
        if needle in text:
            return needle
    return None


def stop(proc):
    if proc and proc.poll() is None:
        proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def judge(mrc, rrc, src, dst, killed):
    """(outcome, why) for one iteration."""
    if mrc == 124 or rrc == 124:
        return "lost", f"hang: migrate {mrc}, receive {rrc}"
    if killed == "migrate":
        if rrc == 0 and (dst or {}).get("outcome") == "completed":
            return "killed", "source killed after the commit: the destination runs"
        if rrc in (1, 3):
            return "killed", "source killed: the destination discarded or holds its state in doubt"
        return "lost", f"source killed, receive exit {rrc}"
    if src is None:
        return "lost", f"no report from migrate (exit {mrc})"
    s_out = src.get("outcome")
    d_out = (dst or {}).get("outcome")
    if mrc == 0:
        if s_out != "completed" or not src.get("verified"):
            return "lost", "migrate exited 0 without a verified completion"
        if killed == "receive":
            return "completed", "receiver killed after it ran"
        if rrc != 0 or d_out != "completed":
            return "lost", f"the source completed, the destination did not (receive exit {rrc})"
        return ("resumed" if src.get("resumptions") else "completed"), ""
    if mrc == 1:
        if s_out != "aborted" or "RUNNING" not in src.get("resolution", ""):
            return "lost", f"migrate exit 1 but the source is not RUNNING: {src.get('resolution')}"
        if rrc == 0 and killed != "receive":
            return "lost", "split brain: the source runs on and so does the destination"
        return "rolled_back", src.get("error", "")[:160]
    if mrc == 3:
        if s_out != "in_doubt":
            return "lost", "migrate exit 3 without in doubt"
        return "in_doubt", src.get("error", "")[:160]
    return "lost", f"migrate exit {mrc}"


def iteration(args, rng, n, tmp, psk):
    d = os.path.join(tmp, f"it{n}")
    os.makedirs(d)
    size = rng.choice([32, 48, 64, 96])
    dev = f"sim:size={size}MiB,hot=2MiB,kv_rate={rng.choice([8, 16, 32])}MiB/s,page=16KiB,step=2ms,seed={n}"
    fault, fargs = draw_fault(rng)
    kill = rng.choices(["none", "migrate", "receive"], weights=[70, 15, 15])[0]
    bw = rng.choice(["50MB/s", "100MB/s", "200MB/s"])
    streams = str(rng.choice([1, 2, 3]))
    port_file, pport_file = os.path.join(d, "port"), os.path.join(d, "pport")
    rx = subprocess.Popen(["timeout", str(BOUND), args.gm, "receive", "--listen", "127.0.0.1:0", "--port-file",
                           port_file, "--device", dev, "--psk-file", psk, "--json", "--run-after", "50ms",
                           "--handshake-timeout", "3s"] + LIVE,
                          stdout=open(os.path.join(d, "rx.json"), "w"), stderr=open(os.path.join(d, "rx.err"), "w"),
                          start_new_session=True)
    port = wait_file(port_file, rx)
    if port is None:
        stop(rx)
        return {"n": n, "fault": fault, "kill": kill, "outcome": "lost", "why": "receiver did not start"}
    px = subprocess.Popen([sys.executable, PROXY, pport_file, port, "--seconds", str(BOUND + 5), "--events",
                           os.path.join(d, "events")] + fargs,
                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "proxy.err"), "w"))
    pport = wait_file(pport_file, px)
    if pport is None:
        stop(rx)
        stop(px)
        return {"n": n, "fault": fault, "kill": kill, "outcome": "lost", "why": "proxy did not start"}
    tx = subprocess.Popen(["timeout", str(BOUND), args.gm, "migrate", "--device", dev, "--to", f"127.0.0.1:{pport}",
                           "--psk-file", psk, "--streams", streams, "--bandwidth", bw, "--warmup", "20ms",
                           "--connect-timeout", "3s", "--json"] + LIVE,
                          stdout=open(os.path.join(d, "tx.json"), "w"), stderr=open(os.path.join(d, "tx.err"), "w"),
                          start_new_session=True)
    killed = None
    if kill != "none":
        time.sleep(rng.uniform(0.2, 3.0))
        victim = tx if kill == "migrate" else rx
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)  # the gpumigrate process itself, not only `timeout`
            killed = kill
    t0 = time.monotonic()
    try:
        mrc = tx.wait(BOUND + 10)
    except subprocess.TimeoutExpired:
        mrc = 124
    try:
        rrc = rx.wait(max(1, BOUND + 20 - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        rrc = 124
    if killed == "migrate":
        mrc = -9
    if killed == "receive":
        rrc = -9
    stop(tx)
    stop(rx)
    stop(px)
    src, dst = report(os.path.join(d, "tx.json")), report(os.path.join(d, "rx.json"))
    try:
        fired = os.path.getsize(os.path.join(d, "events")) > 0  # the proxy logs every fault that took hold
    except OSError:
        fired = False
    outcome, why = judge(mrc, rrc, src, dst, killed)
    for side in ("tx.err", "rx.err"):
        if (hit := sanitizer_report(os.path.join(d, side))):
            outcome, why = "lost", f"{hit} in {side}"
    rec = {"n": n, "fault": fault, "fired": fired, "kill": killed or "none", "streams": int(streams), "bandwidth": bw,
           "device": dev, "outcome": outcome, "why": why, "migrate_rc": mrc, "receive_rc": rrc,
           "resumptions": len((src or {}).get("resumptions", [])),
           "saved_bytes": (src or {}).get("resume_saved_bytes", 0)}
    if outcome == "lost" and args.keep:
        shutil.copytree(d, os.path.join(args.keep, f"it{n}"), dirs_exist_ok=True)
    shutil.rmtree(d, ignore_errors=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gm", required=True)
    ap.add_argument("--duration", type=float, required=True, help="seconds")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--out", help="write the tally and every iteration here (JSON)")
    ap.add_argument("--keep", help="copy the files of every lost iteration here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="gm-soak-")
    psk = os.path.join(tmp, "psk")
    with open(psk, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    os.environ["GPUMIGRATE_CALIBRATION"] = os.path.join(tmp, "calibration.json")
    outcomes = ["completed", "resumed", "rolled_back", "in_doubt", "killed", "lost"]
    tally = {k: 0 for k in outcomes}
    runs = []
    t0 = time.monotonic()
    n = 0
    try:
        while time.monotonic() - t0 < args.duration:
            rec = iteration(args, rng, n, tmp, psk)
            runs.append(rec)
            tally[rec["outcome"]] += 1
            print(f"[{time.monotonic() - t0:7.0f} s] #{n} {rec['fault']:<13}{'' if rec.get('fired') else ' (not fired)':<12} "
                  f"kill={rec['kill']:<8} -> "
                  f"{rec['outcome']}{': ' + rec['why'] if rec['outcome'] == 'lost' else ''}", flush=True)
            n += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    summary = {"seed": args.seed, "seconds": round(elapsed), "migrations": n, **tally,
               "faults_fired": sum(1 for r in runs if r.get("fired")),
               "killed_receivers": sum(1 for r in runs if r.get("kill") == "receive"),
               "resumptions": sum(r.get("resumptions", 0) for r in runs),
               "resume_saved_bytes": sum(r.get("saved_bytes", 0) for r in runs)}
    print("soak tally: " + json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)
    return 0 if tally["lost"] == 0 and n > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
