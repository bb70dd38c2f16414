#!/usr/bin/env python3
"""The QEMU hook end to end: `gpumigrate migrate --qemu` and `gpumigrate receive
--qemu` (two processes, TLS with a PSK) move the running test guest with its
device memory (an shm file outside QEMU's stream) between two real QEMUs.

  migrate        the guest keeps writing RAM and device memory; afterwards the
                 destination guest continues the pass count with ram_bad=0
                 dev_bad=0 (no lost write in either memory), the source QEMU is
                 postmigrate, the reports carry the guest-visible stun and QEMU's figures.
  kill_migrate   `gpumigrate migrate` SIGKILLed mid pre-copy (QEMU migrating its
                 RAM beside the device's second round): the source guest runs
                 on, its QEMU migration is cancellable (and then cancelled), the
                 receiver gives up and its QEMU is told to quit.
  kill_dst_qemu  the destination QEMU SIGKILLed mid pre-copy (while migrating): the migration is
                 aborted, the source guest runs on with clean passes.
  kill_receiver  the receiver SIGKILLed in the final round (prepare-received): the
                 source rolls back and its guest runs on; the destination QEMU,
                 holding a paused copy, never ran.
  bad_args       clear errors, exit 2: a missing QMP socket, shm without --qemu,
                 --qemu with a sim device, a receiver without --qemu-incoming.

Usage: hook_test.py SCENARIO GUEST_ELF GPUMIGRATE. Exit 0 pass, 1 fail, 77 skip.
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


def source_runs_on(pair, label):
    """The source guest keeps passing with no bad page, from the last pass seen now."""
    last = (pair.src.passes() or [{"pass": 0}])[-1]["pass"]
    try:
        pair.src.wait_pass(last + 3, timeout_s=30)
        check(f"{label}: the source guest runs on", True)
    except h.HarnessError as e:
        check(f"{label}: the source guest runs on", False, str(e))
    check(f"{label}: every source pass clean", passes_clean(pair.src.passes()), pair.src.passes()[-5:])


def scenario_migrate(pair, cli):
    port = cli.start_receiver()
    cli.start_source(port)
    tx, rx = cli.wait(cli.source), cli.wait(cli.receiver)
    src_report, dst_report = cli.report("tx"), cli.report("rx")
    check("migrate exits 0", tx == 0, f"rc {tx}: {cli.err('tx')}")
    check("receive exits 0", rx == 0, f"rc {rx}: {cli.err('rx')}")
    check("source outcome completed", src_report.get("outcome") == "completed", src_report)
    check("destination outcome completed", dst_report.get("outcome") == "completed", dst_report)
    q = src_report.get("qemu", {})
    check("source QEMU migration completed", q.get("migration_status") == "completed", q)
    check("source QEMU is postmigrate", q.get("run_state") == "postmigrate", q)
    check("guest-visible stun measured", isinstance(src_report.get("stun_ms"), (int, float)) and
          src_report["stun_ms"] > 0, src_report.get("stun_ms"))
    check("device stun kept beside it", "device_stun_ms" in src_report, list(src_report))
    check("QEMU's RAM excludes the device memory",
          0 < q.get("ram_total_bytes", 0) < (pair.ram_mb + pair.dev_mb) * h.MIB, q)
    dq = dst_report.get("qemu", {})
    check("destination QEMU runs", dq.get("run_state") == "running", dq)
    last_src = pair.src.passes()[-1]["pass"]
    try:
        pair.dst.wait_pass(last_src + 3, timeout_s=30)
        check("the destination guest continues the pass count", True)
    except h.HarnessError as e:
        check("the destination guest continues the pass count", False, str(e))
    dst_passes = pair.dst.passes()
    check("no GUEST-START on the destination (it continued, not booted)",
          "GUEST-START" not in pair.dst.console_text(), pair.dst.console_text()[:200])
    check("destination passes start where the source stopped", dst_passes and dst_passes[0]["pass"] >= last_src,
          f"source ended at {last_src}, destination {dst_passes[:2]}")
    check("every destination pass clean: no lost write in RAM or device memory", passes_clean(dst_passes),
          dst_passes[:5])
    print(f"guest stun {src_report.get('stun_ms')} ms, device stun {src_report.get('device_stun_ms')} ms, "
          f"QEMU downtime {q.get('qemu_downtime_ms')} ms, rounds {src_report.get('rounds')}", flush=True)


def wait_qemu_migrating(cli, timeout_s=30):
    """Until the source's QEMU migration has started (after the device's round 0)."""
    deadline = time.monotonic() + timeout_s
    while "migrating the guest's RAM" not in cli.err("tx"):
        if cli.source.poll() is not None or time.monotonic() > deadline:
            raise h.HarnessError(f"QEMU's migration never started: {cli.err('tx')}")
        time.sleep(0.05)


def scenario_kill_migrate(pair, cli):
    port = cli.start_receiver()
    cli.start_source(port, ["--bandwidth", "16MiB/s"])  # each device round of 64 MiB takes ~4 s, QEMU's RAM too
    wait_qemu_migrating(cli)
    time.sleep(1.0)
    check("migrate still pre-copying when killed", cli.source.poll() is None, cli.err("tx"))
    cli.source.kill()
    cli.source.wait()
    source_runs_on(pair, "after SIGKILL")
    qmp = h.Qmp(pair.src.qmp_path)
    status = qmp.execute("query-migrate").get("status")
    check("QEMU's migration is active or over, not stopped", status in ("active", "failed", "cancelled", "setup"),
          status)
    if status in ("active", "setup"):
        qmp.execute("migrate_cancel")
        deadline = time.monotonic() + 15
        while qmp.execute("query-migrate").get("status") not in ("cancelled", "failed") and time.monotonic() < deadline:
            time.sleep(0.1)
    check("source QEMU running after the cancel", qmp.execute("query-status")["status"] == "running")
    qmp.close()
    source_runs_on(pair, "after migrate_cancel")
    rx = cli.wait(cli.receiver, 60)
    check("the receiver gives up (non-zero)", rx not in (0, "timeout"), f"rc {rx}")
    time.sleep(1.0)
    check("the destination QEMU never ran its guest", not pair.dst.passes(), pair.dst.passes()[:2])


def scenario_kill_dst_qemu(pair, cli):
    port = cli.start_receiver()
    cli.start_source(port, ["--bandwidth", "16MiB/s"])
    wait_qemu_migrating(cli)
    time.sleep(1.0)
    os.kill(pair.dst.pid, signal.SIGKILL)
    tx = cli.wait(cli.source)
    rep = cli.report("tx")
    check("migrate fails (non-zero)", tx not in (0, "timeout"), f"rc {tx}: {cli.err('tx')}")
    check("source outcome aborted", rep.get("outcome") == "aborted", rep)
    check("report names QEMU", "QEMU" in json.dumps(rep) or "qemu" in cli.err("tx"), cli.err("tx"))
    source_runs_on(pair, "after the destination QEMU died")
    qmp = h.Qmp(pair.src.qmp_path)
    check("source QEMU running", qmp.execute("query-status")["status"] == "running")
    qmp.close()


def scenario_kill_receiver(pair, cli):
    port = cli.start_receiver(env={"GPUMIGRATE_TEST_CRASH_AT": "prepare-received"})
    cli.start_source(port)
    tx = cli.wait(cli.source)
    rep = cli.report("tx")
    check("migrate fails (non-zero)", tx not in (0, "timeout"), f"rc {tx}: {cli.err('tx')}")
    check("source outcome aborted (before Prepared)", rep.get("outcome") == "aborted", rep)
    check("the hook gave the guest back", rep.get("qemu", {}).get("rollback", "") != "", rep.get("qemu"))
    source_runs_on(pair, "after the receiver died in the final round")
    check("the destination guest never ran", not pair.dst.passes(), pair.dst.passes()[:2])
    if pair.dst.alive():
        qmp = h.Qmp(pair.dst.qmp_path)
        st = qmp.execute("query-status")["status"]
        check("the destination QEMU is not running", st != "running", st)
        qmp.close()


def scenario_bad_args(pair, cli):
    def run(args, expect):
        r = subprocess.run([cli.gm, *args], capture_output=True, text=True, timeout=60)
        check(f"{args[0]} {expect!r}: exit 2", r.returncode == 2, f"rc {r.returncode}: {r.stderr}")
        check(f"{args[0]} {expect!r}: named", expect in r.stderr, r.stderr)
    p = pair
    run(["migrate", "--to", "127.0.0.1:1", "--device", f"shm:{p.src.dev_path}", "--qemu", "/nonexistent/src.qmp",
         "--insecure-no-tls"], "/nonexistent/src.qmp")
    run(["migrate", "--to", "127.0.0.1:1", "--device", f"shm:{p.src.dev_path}", "--insecure-no-tls"], "--qemu")
    run(["migrate", "--to", "127.0.0.1:1", "--device", "sim:size=64MiB", "--qemu", p.src.qmp_path,
         "--insecure-no-tls"], "shm:PATH")
    run(["receive", "--listen", "127.0.0.1:0", "--device", f"shm:{p.dst.dev_path}", "--qemu", p.dst.qmp_path,
         "--insecure-no-tls"], "--qemu-incoming")
    # The source QEMU is running, not inmigrate: it cannot be a destination.
    run(["receive", "--listen", "127.0.0.1:0", "--device", f"shm:{p.dst.dev_path}", "--qemu", p.src.qmp_path,
         "--qemu-incoming", p.uri, "--insecure-no-tls", "--accept-timeout", "1s"], "expected inmigrate")
    source_runs_on(pair, "after the refused commands")


SCENARIOS = {"migrate": scenario_migrate, "kill_migrate": scenario_kill_migrate,
             "kill_dst_qemu": scenario_kill_dst_qemu, "kill_receiver": scenario_kill_receiver,
             "bad_args": scenario_bad_args}


def main(argv):
    if len(argv) != 4 or argv[1] not in SCENARIOS:
        print(__doc__, file=sys.stderr)
        return 2
    scenario, guest_elf, gm = argv[1:]
    if not shutil.which(h.QEMU):
        print(f"SKIP: {h.QEMU} not found (scripts/bootstrap installs qemu-system-x86)")
        return SKIP
    if not guest_elf or not os.path.exists(guest_elf):
        print("SKIP: the test guest was not built (the C compiler cannot emit freestanding -m32 code)")
        return SKIP
    signal.alarm(170)
    h.install_cleanup_on_signals()
    workdir = tempfile.mkdtemp(prefix=f"gm-hook-{scenario}-")
    cli = None
    try:
        with h.Pair(workdir, guest_elf, ram_mb=64, dev_mb=64, guest_ram_mb=32, period=5) as pair:
            print(f"accel={pair.accel} workdir={workdir}", flush=True)
            pair.start()
            pair.src.wait_pass(3, timeout_s=30)
            cli = Cli(gm, workdir, pair)
            SCENARIOS[scenario](pair, cli)
            if failed() or os.environ.get("GM_HOOK_VERBOSE"):
                for side in ("tx", "rx"):
                    if (cli.source if side == "tx" else cli.receiver) is not None:
                        print(f"--- {side} stderr:\n{cli.err(side)}", flush=True)
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
