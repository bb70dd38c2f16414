#!/usr/bin/env python3
"""`gpumigrate estimate --qemu SRC.qmp --device shm:PATH` against a real running
QEMU with the self-checking test guest, then the real migration it predicts.

  - bad flags are refused with exit 2 and a clear message: a missing QMP socket,
    shm without --qemu, --qemu with a sim device, a fractional --qemu-dirty-sample;
  - the estimate's JSON carries a `qemu` object: guest RAM close to the pair's
    node-0 RAM (the shm node left out), a dirty rate above zero (the guest writes
    RAM every pass), and a predicted guest-visible stun;
  - the device's rounds are modelled on the path calibration of the transport
    `migrate --qemu` takes (tls, 2 streams, the --link cap), measured while the
    VM runs, not on the in-process pipeline;
  - the estimate starts no migration: the source QEMU is still running, its
    query-migrate is empty, and the guest keeps passing with clean pages;
  - then `gpumigrate receive --qemu` / `migrate --qemu` move the guest, and the
    predicted and measured guest stuns are printed side by side. Their agreement
    is not asserted: tests check correctness, not timing.

Usage: estimate_test.py GUEST_ELF GPUMIGRATE. Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qemu_harness as h  # noqa: E402

from gm_cli import SKIP, Cli, check, failed, passes_clean  # noqa: E402

LINK = "1GiB/s"


def bad_args(gm, pair):
    def run(args, expect):
        r = subprocess.run([gm, "estimate", *args], capture_output=True, text=True, timeout=60)
        check(f"estimate {expect!r}: exit 2", r.returncode == 2, f"rc {r.returncode}: {r.stderr}")
        check(f"estimate {expect!r}: named", expect in r.stderr, r.stderr)
    dev = f"shm:{pair.src.dev_path}"
    run(["--device", dev, "--qemu", "/nonexistent/src.qmp"], "/nonexistent/src.qmp")
    run(["--device", dev], "--qemu")
    run(["--device", "sim:size=64MiB", "--qemu", pair.src.qmp_path], "shm:PATH")
    run(["--device", dev, "--qemu", pair.src.qmp_path, "--qemu-dirty-sample", "1500ms"], "whole seconds")


def estimate(gm, pair, workdir):
    argv = [gm, "estimate", "--qemu", pair.src.qmp_path, "--device", f"shm:{pair.src.dev_path}", "--link", LINK,
            "--json"]
    png = os.path.join(workdir, "estimate.png")
    plot = shutil.which("gnuplot") is not None
    if plot:
        argv += ["--plot", png]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    with open(os.path.join(workdir, "estimate.err"), "w") as f:
        f.write(r.stderr)
    check("estimate exits 0", r.returncode == 0, f"rc {r.returncode}: {r.stderr[-2000:]}")
    if plot:
        with open(png, "rb") as f:
            head = f.read(8)
        check("--plot draws the guest's prediction as a PNG", head == b"\x89PNG\r\n\x1a\n" and
              os.path.getsize(png) > 20000, f"{head!r}, {os.path.getsize(png)} bytes")
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        check("estimate prints one JSON object", False, r.stdout[-2000:])
        return {}


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    guest_elf, gm = argv[1:]
    if not shutil.which(h.QEMU):
        print(f"SKIP: {h.QEMU} not found (scripts/bootstrap installs qemu-system-x86)")
        return SKIP
    if not guest_elf or not os.path.exists(guest_elf):
        print("SKIP: the test guest was not built (the C compiler cannot emit freestanding -m32 code)")
        return SKIP
    signal.alarm(170)
    h.install_cleanup_on_signals()
    workdir = tempfile.mkdtemp(prefix="gm-estimate-")
    cli = None
    try:
        with h.Pair(workdir, guest_elf, ram_mb=64, dev_mb=64, guest_ram_mb=32, period=5) as pair:
            print(f"accel={pair.accel} workdir={workdir}", flush=True)
            pair.start()
            pair.src.wait_pass(3, timeout_s=30)
            bad_args(gm, pair)

            est = estimate(gm, pair, workdir)
            q = est.get("qemu", {})
            check("the JSON has a qemu object", bool(q), list(est))
            ram = q.get("ram_bytes", 0)
            check("RAM: the node-0 RAM, not the shm node", abs(ram - pair.ram_mb * h.MIB) <= pair.ram_mb * h.MIB // 20,
                  f"{ram} vs {pair.ram_mb} MiB")
            check("RAM dirty rate above zero", q.get("dirty_rate_bytes_per_s", 0) > 0, q)
            check("dirty sample seconds reported", q.get("dirty_sample_s") == 1, q)
            check("how the link is shared is reported", "ram_share_while_both_send" in q.get("link_model", {}), q)
            stun = est.get("predicted_stun_ms")
            check("a predicted guest-visible stun", isinstance(stun, (int, float)) and stun > 0, stun)
            check("a decision", est.get("decision") in ("live-migrate", "drain-and-replace", "cannot-converge"), est)
            key = est.get("path_calibration", {}).get("key", "")
            check("the device's rounds are modelled on the path migrate --qemu takes (two processes, TLS, its cap)",
                  key.startswith("tls/2/none/") and key != "tls/2/none/uncapped", est.get("path_calibration"))
            check("the assumptions name QEMU", any("QEMU" in a for a in est.get("assumptions", [])),
                  est.get("assumptions"))

            qmp = h.Qmp(pair.src.qmp_path)
            st = qmp.execute("query-status")["status"]
            mig = qmp.execute("query-migrate")
            qmp.close()
            check("the source QEMU still runs after the estimate", st == "running", st)
            check("the estimate started no migration", mig.get("status", "none") == "none", mig)
            last = pair.src.passes()[-1]["pass"]
            pair.src.wait_pass(last + 3, timeout_s=30)
            check("the guest kept running with clean passes", passes_clean(pair.src.passes()),
                  pair.src.passes()[-5:])

            cli = Cli(gm, workdir, pair)
            port = cli.start_receiver()
            cli.start_source(port, ["--bandwidth", LINK])
            tx, rx = cli.wait(cli.source), cli.wait(cli.receiver)
            rep = cli.report("tx")
            check("migrate exits 0", tx == 0, f"rc {tx}: {cli.err('tx')}")
            check("receive exits 0", rx == 0, f"rc {rx}: {cli.err('rx')}")
            mq = rep.get("qemu", {})
            print(f"predicted guest stun {stun:.1f} ms (range {est.get('predicted_stun_range_ms')}), "
                  f"QEMU pauses first: {q.get('paused_first')}, RAM in the stun {q.get('ram_final_bytes')} B, "
                  f"total {est.get('predicted_total_ms', 0):.0f} ms", flush=True)
            print(f"measured  guest stun {rep.get('stun_ms')} ms, device stun {rep.get('device_stun_ms')} ms, "
                  f"QEMU paused by itself: {mq.get('paused_on_its_own')}, RAM left at the pause "
                  f"{mq.get('ram_remaining_at_pause_bytes')} B, QEMU downtime {mq.get('qemu_downtime_ms')} ms, "
                  f"total {rep.get('total_ms')} ms", flush=True)
            if failed() or os.environ.get("GM_HOOK_VERBOSE"):
                with open(os.path.join(workdir, "estimate.err")) as f:
                    print(f"--- estimate stderr:\n{f.read()[-3000:]}", flush=True)
                print(f"--- tx stderr:\n{cli.err('tx')}\n--- rx stderr:\n{cli.err('rx')}", flush=True)
            cli.close()
    except h.HarnessError as e:
        check("harness", False, str(e))
    finally:
        if cli is not None:
            cli.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print("FAILED" if failed() else "PASSED", flush=True)
    return 1 if failed() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
