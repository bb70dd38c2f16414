#!/usr/bin/env python3
"""QEMU migrating the test guest by itself, with the device memory (NUMA node 1,
a share=on file) kept out of its stream by x-ignore-shared; the baseline that the
gpumigrate-driven migration is later compared against. Scenarios:

  baseline  at pre-switchover the device file is copied into the destination's
            in place, then migrate-continue, completed on both, cont: the
            destination guest continues the pass count with ram_bad=0 dev_bad=0.
  no_copy   the same without the copy: the destination's first pass reports
            dev_bad > 0, which proves the guest's check sees lost device writes.
  cancel    migrate_cancel at pre-switchover: the source runs on (RESUME,
            `running`) and its guest keeps passing with no bad page; the
            destination QEMU exits (docs/qemu-facts.md §2).

Usage: baseline_test.py SCENARIO GUEST_ELF. Exit 0 pass, 1 fail, 77 skip (no QEMU,
no guest). Each step has its own timeout and the whole run an alarm at 80 s.
"""
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qemu_harness as h  # noqa: E402

SKIP = 77
failed = False


def check(name, ok, detail=""):
    global failed
    print(f"ok: {name}" if ok else f"FAIL: {name}: {detail}", flush=True)
    failed |= not ok


def wait_status(qmp, wanted, timeout_s=30):
    """The MIGRATION event with a status in wanted or a terminal one; returns that status."""
    e = qmp.wait_event("MIGRATION", lambda d: d["status"] in set(wanted) | {"failed", "cancelled"}, timeout_s)
    return e["data"]["status"]


def run(scenario, guest_elf, workdir):
    t0 = time.monotonic()
    with h.Pair(workdir, guest_elf, ram_mb=64, dev_mb=32, guest_ram_mb=32, period=10) as p:
        print(f"accel={p.accel} workdir={workdir}", flush=True)
        p.start()
        src, dst = p.src, p.dst
        src.wait_pass(3, timeout_s=30)
        check("source guest started", "GUEST-START" in src.console_text(), src.console_text()[:200])
        check("source passes clean before migrating", all(x["ram_bad"] == 0 and x["dev_bad"] == 0 for x in src.passes()),
              src.passes())
        check("destination is inmigrate", dst.qmp.execute("query-status")["status"] == "inmigrate")

        p.set_migration_caps(max_bandwidth_bytes_per_s=256 << 20)  # a few passes dirty RAM while it is sent
        dst.qmp.execute("migrate-incoming", {"uri": p.uri})
        src.qmp.execute("migrate", {"uri": p.uri})
        status = wait_status(src.qmp, ["pre-switchover"])
        check("source reaches pre-switchover", status == "pre-switchover", f"status {status}: {src.qmp.execute('query-migrate')}")
        if status != "pre-switchover":
            return
        check("source vCPUs stopped at pre-switchover", src.qmp.execute("query-status")["status"] == "finish-migrate")
        last_src = src.passes()[-1]["pass"]

        if scenario == "cancel":
            src.qmp.execute("migrate_cancel")
            check("source migration cancelled", wait_status(src.qmp, ["cancelled"]) == "cancelled")
            src.qmp.wait_event("RESUME", timeout_s=10)
            check("source running again", src.qmp.execute("query-status")["status"] == "running")
            src.wait_pass(last_src + 3, timeout_s=20)
            after = [x for x in src.passes() if x["pass"] > last_src]
            check("source guest passes on after the cancel, clean",
                  len(after) >= 3 and all(x["ram_bad"] == 0 and x["dev_bad"] == 0 for x in after), after)
            try:
                rc = dst.proc.wait(timeout=10)
            except Exception:
                rc = None
            check("destination QEMU exits after the cancel", rc is not None, "still running after 10 s")
            print(f"destination exit code {rc}; log: {dst.log_tail()}")
            check("destination guest never ran", dst.passes() == [], dst.console_text()[:200])
        else:
            if scenario == "baseline":
                c0 = time.monotonic()
                h.copy_device(src.dev_path, dst.dev_path)
                print(f"device copy {p.dev_mb} MiB in {(time.monotonic() - c0) * 1000:.0f} ms")
            src.qmp.execute("migrate-continue", {"state": "pre-switchover"})
            check("source completed", wait_status(src.qmp, ["completed"]) == "completed", src.qmp.execute("query-migrate"))
            check("destination completed", wait_status(dst.qmp, ["completed"]) == "completed", dst.qmp.execute("query-migrate"))
            info = src.qmp.execute("query-migrate")
            ram_total = info.get("ram", {}).get("total", 0)
            check("device memory stayed out of QEMU's stream (ram.total < RAM + device)",
                  ram_total < (p.ram_mb + p.dev_mb) * h.MIB, f"ram.total {ram_total}")
            print(f"source: total-time {info.get('total-time')} ms, downtime {info.get('downtime')} ms, ram.total {ram_total}, "
                  f"dirty-sync-count {info.get('ram', {}).get('dirty-sync-count')}")
            # QEMU 7.2 sets "completed" before its main loop moves the run state
            # from finish-migrate to postmigrate (migration_iteration_finish, a
            # bottom half): the status may lag the event by a moment.
            run_state = src.qmp.execute("query-status")["status"]
            t_end = time.monotonic() + 5
            while run_state == "finish-migrate" and time.monotonic() < t_end:
                time.sleep(0.02)
                run_state = src.qmp.execute("query-status")["status"]
            check("source postmigrate", run_state == "postmigrate", f"run state {run_state}")
            check("destination paused (-S)", dst.qmp.execute("query-status")["status"] == "paused")
            dst.qmp.execute("cont")
            dst.wait_pass(last_src + 3, timeout_s=20)
            got = dst.passes()
            check("destination continues the pass count, no reboot",
                  "GUEST-START" not in dst.console_text() and got and got[0]["pass"] in (last_src + 1, last_src + 2),
                  f"source's last pass {last_src}, destination: {dst.console_text()[:300]}")
            check("destination RAM intact", all(x["ram_bad"] == 0 for x in got), got)
            if scenario == "baseline":
                check("destination device memory intact", all(x["dev_bad"] == 0 for x in got), got)
            else:
                # The source is almost always idle in hlt at the pause, so the first
                # destination pass checks the source's last one. If the pause caught a
                # pass half done, the second pass still sees the half written on the source.
                pages = p.dev_mb * h.MIB // 4096
                check("destination detects the lost device writes (dev_bad > 0 in its first passes)",
                      any(x["dev_bad"] > 0 for x in got[:2]), got[:3])
                check("device errors are at most every page", all(x["dev_bad"] <= pages for x in got), got)
                check("then the guest's own writes check clean", got[-1]["dev_bad"] == 0, got)
            print(f"destination passes: {got[:4]}")
    print(f"{scenario}: {time.monotonic() - t0:.1f} s", flush=True)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("baseline", "no_copy", "cancel"):
        print("usage: baseline_test.py baseline|no_copy|cancel GUEST_ELF", file=sys.stderr)
        return 2
    scenario, guest_elf = sys.argv[1], sys.argv[2]
    if not shutil.which(h.QEMU):
        print(f"SKIP: {h.QEMU} not found (scripts/bootstrap installs qemu-system-x86)")
        return SKIP
    if not guest_elf or not os.path.exists(guest_elf):
        print(f"SKIP: no test guest ('{guest_elf}'): the C compiler cannot build -m32 -ffreestanding code, or it is not built")
        return SKIP
    h.install_cleanup_on_signals()
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(h.HarnessError("the test ran past 80 s")))
    signal.alarm(80)
    workdir = tempfile.mkdtemp(prefix=f"gm-qemu-{scenario}-")
    try:
        run(scenario, guest_elf, workdir)
    except h.HarnessError as e:
        check(scenario, False, e)
    finally:
        signal.alarm(0)
        if failed:
            for name in sorted(os.listdir(workdir)):
                if name.endswith((".con", ".log")):
                    text = open(os.path.join(workdir, name), errors="replace").read().strip().splitlines()
                    print(f"--- {name} (last 8 lines)\n" + "\n".join(text[-8:]))
        shutil.rmtree(workdir, ignore_errors=True)
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith(f"gm-{os.getpid()}-")]
    check("no /dev/shm files left", not leftovers, leftovers)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
