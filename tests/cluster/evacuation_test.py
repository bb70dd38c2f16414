#!/usr/bin/env python3
"""Evacuations that go wrong, on a fleet of network namespaces (fleet.py), every
link shaped with tc to 200 Mbit and one agent per host:

  1. a link that collapses: gpu-a's link is cut to 2 Mbit while chat-1 (max
     stun 2 s, its hot set 4 MiB) live-migrates. The migration is aborted
     within its round, within 5 s of the cut (the round would take minutes at
     that rate), saying the stun would exceed max stun and naming the link's
     rate; chat-1 runs on at gpu-a, and the
     evacuation re-plans it as drain-and-replace (replacement first) and
     completes;
  2. the controller SIGKILLed mid-evacuation and started again with the same
     --id: it completes from its journal, each VM migrated exactly once and
     verified at its target;
  3. a controller whose certificate another CA signed: refused by every agent,
     and its evacuation moves nothing; an evacuation that cannot fit (every
     target in maintenance): refused with the reason, nothing moved, by
     `evacuate` and by `scripts/maintenance-mode enter` (which leaves the host
     in the pool); then a
     target agent SIGKILLed mid-migration: the VM stays on its source (the
     migration rolled back there) and is re-planned onto the other target;
  4. a proc VM (a gpumigrate-workload process writing its memory, started in
     gpu-a's namespace) evacuated to gpu-b, whose agent starts the process it
     moves into (its adopter): the source process released, the adopting one
     checked every page against the source at stop and ran on, and gpu-b lists
     the VM at that process.

  5. two controllers, one etcd store: gpu-a and gpu-c evacuated at once, each
     plan made before the other ran, so both chose the one free slot on gpu-b.
     One reserves it and migrates there; the other's reservation is refused
     (the slot named, and who holds it), it re-plans with that slot counted
     as taken and migrates its VM to gpu-d; each VM moved once.

  6. the plan's per-VM time budget: gpu-a's link cut to 2 Mbit while a VM
     with a budget of 8 s (and max stun 100 s) migrates: aborted within 5 s of
     the cut over its budget, re-planned (blocked, with the reason);
  7. a link slower than the inventory says (200 Mbit planned, 40 Mbit by tc):
     the first migration carries a fifth of what its plan gave it, the
     controller learns the link's rate and plans the VMs left again at it.

Usage: evacuation_test.py GPUMIGRATE [WORKLOAD] (WORKLOAD: gpumigrate-workload,
by default beside GPUMIGRATE). Exit 0 pass, 1 fail, 77 skip (no root or no
namespaces here).
"""
import json
import os
import re
import shutil
import shlex
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
from fleet import REPO, Fleet, mig_gpus  # noqa: E402

failures = []


def check(name, ok, detail=""):
    print(f"{'ok' if ok else 'FAIL'}: {name}{'' if ok else f': {detail}'}", flush=True)
    if not ok:
        failures.append(name)
    return ok


def vm(name, device, profile, placement, **extra):
    return dict({"name": name, "device": device, "gpus": [0], "profile": profile, "placement": placement,
                 "class": "inference"}, **extra)


class Watch:
    """Runs a controller command in the ctl namespace, keeping its stderr lines with the time each came."""

    def __init__(self, fleet, argv):
        self.lines = []
        self.p = fleet.popen_ctl(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out = ""
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._o = threading.Thread(target=self._read_out, daemon=True)
        self._o.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append((time.monotonic(), line.rstrip()))

    def _read_out(self):
        self.out = self.p.stdout.read()

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return t, m
            if self.p.poll() is not None and not self._t.is_alive():
                break
            time.sleep(0.05)
        return None, None

    def finish(self, timeout):
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self._t.join(5)
        self._o.join(5)
        return rc

    def text(self):
        return "\n".join(line for _, line in self.lines)


def cut_mid_migration(f, vm_name):
    """Evacuates gpu-a and cuts its link to 2 Mbit 1 s after vm_name's migration started. Returns (watch,
    the match of the start line, monotonic and unix-ms times of the cut), or None (checked) if it never started."""
    w = Watch(f, f.evacuate_argv("gpu-a", "--yes", "--json", "--store", f"{f.tmp}/store", "--poll", "100ms"))
    t_start, m = w.wait_for(rf"{vm_name}: live-migrate to (gpu-.) started", 60)
    if not check(f"{vm_name}'s migration started", t_start is not None, w.text()):
        w.finish(5)
        return None
    time.sleep(1.0)
    f.cluster.set_rate("gpu-a", "2mbit")
    return w, m, time.monotonic(), time.time() * 1000


def collapse(binary):
    print("-- 1. a link that collapses mid-migration", flush=True)
    sim = "sim:size=64MiB,static=0.9,hot=4MiB,page=64KiB"
    chat = {"name": "chat", "min_serving": 1, "replica_start": "60s", "drain": "1s"}
    hosts = {
        "gpu-a": {"gpus": mig_gpus("mig"), "vms": [
            vm("chat-1", sim, "1g.10gb", 0, **{"class": "stateless-inference", "group": "chat", "max_stun": "2s"})]},
        "gpu-b": {"gpus": mig_gpus("mig")},
        "gpu-c": {"gpus": mig_gpus("mig"), "vms": [
            vm("chat-2", sim, "1g.10gb", 0, **{"class": "stateless-inference", "group": "chat"})]},
    }
    with Fleet(binary, hosts, groups=[chat]) as f:
        plan = f.run_ctl(f.evacuate_argv("gpu-a", "--dry-run", "--json"))
        actions = json.loads(plan.stdout)["actions"] if plan.returncode == 0 else []
        check("the plan live-migrates chat-1 (its replacement would take 60 s)",
              [a["action"] for a in actions] == ["live-migrate"], plan.stdout + plan.stderr)
        cut = cut_mid_migration(f, "chat-1")
        if cut is None:
            return
        w, m, t_cut, cut_unix_ms = cut
        t_fail, _ = w.wait_for(r"chat-1.*(exceeds max stun)", 120)
        rc = w.finish(120)
        text = w.text()
        check("the migration was aborted, saying the stun would exceed max stun", t_fail is not None, text)
        if t_fail is not None:
            # Round 0 alone had ~40 MiB left: ~170 s at 2 Mbit. The controller shows the abort within the
            # round, a poll of the agent's and one of its own after the migration ended (below).
            check(f"the controller showed it {t_fail - t_cut:.1f} s after the cut (within 10 s)",
                  t_fail - t_cut < 10, text)
        check("the reason names the link's rate now", "the link carries" in text, text)
        check("the evacuation completed after re-planning (exit 0)", rc == 0, f"exit {rc}: {text[-3000:]}")
        report = json.loads(w.out) if w.out.strip() else {}
        outcome = {v["vm"]: v for v in report.get("vms", [])}.get("chat-1", {})
        check("chat-1 was re-planned as drain-and-replace, completed",
              outcome.get("action") == "drain-and-replace" and outcome.get("outcome") == "completed", str(outcome))
        migrates = [j for j in f.jobs("gpu-a") if j["kind"] == "migrate" and j["vm"] == "chat-1"]
        job = json.dumps(migrates)
        check("gpu-a's migrate job failed, the source running with its memory intact",
              len(migrates) == 1 and migrates[0]["state"] == "failed" and "RUNNING with its memory intact" in job,
              job[:3000])
        if migrates and migrates[0].get("ended_unix_ms"):
            # The goal of issue 39: aborted within 5 s of the collapse. The agent notes the end of its
            # migrate process within its 200 ms poll.
            after = (migrates[0]["ended_unix_ms"] - cut_unix_ms) / 1000
            check(f"the migration ended {after:.1f} s after the cut (within 5 s)", after < 5, job[:3000])
        check("its report recommends drain-and-replace", len(migrates) == 1 and
              migrates[0].get("report", {}).get("drain_recommended") is True, job[:3000])
        target = m.group(1)
        received = [j for j in f.jobs(target) if j["kind"] == "receive" and j["state"] == "completed"]
        check(f"nothing was received on {target}", not received, json.dumps(received)[:1000])
        # Its receive ended as failed (by the source's Abort or the controller's cancel), not lost or held: the
        # slot was free for the re-plan.
        receives = [j for j in f.jobs(target) if j["kind"] == "receive" and j["vm"] == "chat-1"]
        check(f"{target}'s receive for chat-1 ended failed, holding nothing",
              len(receives) == 1 and receives[0]["state"] == "failed", json.dumps(receives)[:2000])
        print(f"   ({target}'s receive: {receives[0].get('detail', '')[:300] if receives else '-'})", flush=True)
        hooks = f.hooks()
        start = next((i for i, line in enumerate(hooks) if line.startswith("start chat-1-replica")), None)
        drain = next((i for i, line in enumerate(hooks) if line == "drain chat-1 on gpu-a"), None)
        check("chat-1's replacement started before chat-1 drained", start is not None and drain is not None
              and start < drain, str(hooks))


def controller_killed(binary):
    print("-- 2. the controller SIGKILLed mid-evacuation, then started again", flush=True)
    sim = "sim:size=24MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s"
    hosts = {
        "gpu-a": {"gpus": mig_gpus("mig"), "vms": [vm("llm-1", sim, "3g.40gb", 0), vm("llm-2", sim, "1g.10gb", 4)]},
        "gpu-b": {"gpus": mig_gpus("mig")},
        "gpu-c": {"gpus": mig_gpus("mig")},
    }
    with Fleet(binary, hosts) as f:
        evac = f.evacuate_argv("gpu-a", "--yes", "--id", "evac-1", "--store", f"{f.tmp}/store", "--poll", "100ms",
                               "--bandwidth", "5MB/s")
        w = Watch(f, evac)
        t, _ = w.wait_for(r"live-migrate to gpu-. started", 60)
        time.sleep(0.5)
        w.p.send_signal(signal.SIGKILL)
        w.finish(10)
        check("the first controller had started a migration when it was killed", t is not None, w.text())
        r = f.run_ctl(evac + ["--json"], timeout=240)
        check("the restarted controller completes the evacuation", r.returncode == 0,
              f"exit {r.returncode}: {r.stderr[-3000:]}")
        check("it continued from its journal", "continuing evacuation evac-1 from its journal" in r.stderr,
              r.stderr[-2000:])
        check("gpu-a is empty", f.vms_on("gpu-a") == [], str(f.vms_on("gpu-a")))
        for name in ("llm-1", "llm-2"):
            migrates = [j for j in f.jobs("gpu-a") if j["kind"] == "migrate" and j["vm"] == name]
            check(f"{name} was migrated exactly once", len(migrates) == 1 and migrates[0]["state"] == "completed",
                  str([(j["id"], j["state"]) for j in migrates]))
            recv = [j for h in ("gpu-b", "gpu-c") for j in f.jobs(h)
                    if j["kind"] == "receive" and j["vm"] == name and j["state"] == "completed"]
            check(f"{name} was verified at its target",
                  len(recv) == 1 and recv[0].get("report", {}).get("verified") is True, json.dumps(recv)[:1000])


def refusals_and_target_killed(binary):
    print("-- 3. a foreign controller, an infeasible evacuation, a target agent killed", flush=True)
    sim = "sim:size=24MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s"
    hosts = {
        "gpu-a": {"gpus": mig_gpus("mig"), "vms": [vm("llm-9", sim, "3g.40gb", 0)]},
        "gpu-b": {"gpus": mig_gpus("mig")},
        "gpu-c": {"gpus": mig_gpus("mig")},
    }
    with Fleet(binary, hosts) as f:
        foreign = f"{f.tmp}/foreign"
        subprocess.run([os.path.join(REPO, "scripts", "make-test-certs"), foreign, f.addr("ctl")], check=True,
                       stderr=subprocess.DEVNULL)
        for h in f.names:
            r = f.call(h, "inventory", pki=foreign)
            check(f"{h}'s agent refuses a controller another CA signed", not r.get("ok"), str(r))
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--yes", "--store", f"{f.tmp}/store", pki=foreign), timeout=120)
        check("an evacuation by that controller fails", r.returncode != 0, r.stderr[-1000:])
        refused = [h for h in f.names if re.search(r"refus|handshake|certificate", f.log(h), re.I)]
        check("every agent logged the refusal", refused == f.names, f"logged by {refused}")
        check("nothing moved", f.vms_on("gpu-a") == ["llm-9"], str(f.vms_on("gpu-a")))

        for h in ("gpu-b", "gpu-c"):
            f.call(h, "maintenance", {"enter": True})
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--yes", "--id", "infeasible", "--store", f"{f.tmp}/store"),
                      timeout=120)
        check("an evacuation with every target in maintenance is refused (exit 1)", r.returncode == 1,
              f"exit {r.returncode}: {r.stderr[-1000:]}")
        check("saying why", "refused:" in r.stderr, r.stderr[-1000:])
        check("nothing moved", f.vms_on("gpu-a") == ["llm-9"], str(f.vms_on("gpu-a")))
        # The same through the operators' script: refused before anything changes, gpu-a not even
        # put into maintenance.
        r = f.run_ctl([os.path.join(REPO, "scripts", "maintenance-mode"), "enter", "gpu-a", "--inventory",
                       f.inventory, *f.ctl_tls(), "--store", f"{f.tmp}/store"],
                      env=dict(f.env or os.environ, GPUMIGRATE=binary), timeout=120)
        out = r.stdout + r.stderr
        check("scripts/maintenance-mode enter refuses the infeasible evacuation (exit 1)", r.returncode == 1,
              f"exit {r.returncode}: {out[-1500:]}")
        check("it prints the plan's reason and that nothing was changed",
              "cannot be evacuated" in out and "nothing was changed" in out and "blocked" in out, out[-1500:])
        status = f.call("gpu-a", "inventory")
        check("gpu-a was left in the pool, its VM on it",
              status.get("ok") and not status["host"].get("maintenance") and f.vms_on("gpu-a") == ["llm-9"],
              json.dumps(status)[:1500])
        for h in ("gpu-b", "gpu-c"):
            f.call(h, "maintenance", {"enter": False})

        w = Watch(f, f.evacuate_argv("gpu-a", "--yes", "--id", "evac-9", "--store", f"{f.tmp}/store", "--poll",
                                     "100ms", "--bandwidth", "3MB/s", "--resume-window", "2s"))
        t, m = w.wait_for(r"llm-9: live-migrate to (gpu-.) started", 60)
        if not check("llm-9's migration started", t is not None, w.text()):
            w.finish(5)
            return
        first = m.group(1)
        time.sleep(1.0)
        f.kill_agent(first)
        rc = w.finish(240)
        text = w.text()
        check("the evacuation completes on the other target (exit 0)", rc == 0, f"exit {rc}: {text[-3000:]}")
        check("the failure was re-planned", "re-planned the VMs left after: llm-9 failed" in text, text[-2000:])
        targets = re.findall(r"llm-9: live-migrate to (gpu-.) started", text)
        check(f"llm-9 went to the other target after {first} died", len(targets) >= 2 and targets[-1] != first,
              str(targets))
        migrates = [j for j in f.jobs("gpu-a") if j["kind"] == "migrate" and j["vm"] == "llm-9"]
        check("the first migration failed with the source running, memory intact",
              len(migrates) == 2 and migrates[0]["state"] == "failed"
              and "RUNNING with its memory intact" in json.dumps(migrates[0]), json.dumps(migrates)[:3000])
        check("gpu-a is empty", f.vms_on("gpu-a") == [], str(f.vms_on("gpu-a")))


def proc_vm(binary, workload):
    print("-- 4. a proc VM: a live process moved into one the target's agent starts", flush=True)
    geometry = ["--size", "32MiB", "--seed", "7", "--pattern", "hot", "--hot", "0.1", "--rate", "20MB/s"]
    hosts = {
        "gpu-a": {"gpus": mig_gpus("mig"), "processes": {"kv": [workload, *geometry]},
                  "vms": [vm("kv-1", "proc:{pid:kv}", "1g.10gb", 0, receive_device="adopt:kv32")]},
        "gpu-b": {"gpus": mig_gpus("mig")},
    }
    adopters = {"kv32": {"command": [workload, *geometry, "--adopt", "--adopt-timeout", "120s", "--run-after", "2s"]}}
    with Fleet(binary, hosts, adopters=adopters) as f:
        source_pid = f.processes[("gpu-a", "kv")][1]
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--yes", "--json", "--store", f"{f.tmp}/store", "--poll", "100ms"),
                      timeout=240)
        check("the evacuation of the proc VM completes (exit 0)", r.returncode == 0,
              f"exit {r.returncode}: {r.stderr[-3000:]}")
        check("gpu-a is empty", f.vms_on("gpu-a") == [], str(f.vms_on("gpu-a")))
        inv = f.call("gpu-b", "inventory")
        there = {v["name"]: v for v in inv.get("vms", [])}.get("kv-1", {})
        m = re.fullmatch(r"proc:(\d+)", there.get("device", ""))
        check("gpu-b lists kv-1 at the process its adopter started", m is not None and int(m.group(1)) != source_pid
              and there.get("receive_device") == "adopt:kv32", json.dumps(there))
        src = f.process("gpu-a", "kv")
        try:
            src.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        out = src.stdout.read() if src.poll() is not None else ""
        check("the source process was released and ended (exit 0)", src.poll() == 0 and "released at step" in out,
              f"exit {src.poll()}: {out}")
        deadline = time.monotonic() + 20
        adopted = ""
        while time.monotonic() < deadline and "ran on to step" not in adopted:
            adopted = f.adopter_output("gpu-b", "kv-1")
            time.sleep(0.2)
        check("the adopting process found every page equal to the source at stop",
              re.search(r"adopted at step \d+: \d+ pages equal to the source at stop", adopted) is not None, adopted)
        check("and ran on, writing, its self-check passing", re.search(r"ran on to step \d+: \d+ pages OK", adopted)
              is not None, adopted)


def budget(binary):
    print("-- 6. a migration that can no longer end within the plan's time budget", flush=True)
    sim = "sim:size=64MiB,static=0.9,hot=4MiB,page=64KiB"
    hosts = {
        "gpu-a": {"gpus": mig_gpus("mig"), "vms": [vm("llm-5", sim, "1g.10gb", 0)]},
        "gpu-b": {"gpus": mig_gpus("mig")},
    }
    # Max stun 100 s: the stun rule never fires here; only the budget can stop it.
    with Fleet(binary, hosts, policy={"max_stun": "100s", "budget_min": "8s"}) as f:
        plan = f.run_ctl(f.evacuate_argv("gpu-a", "--dry-run", "--json"))
        actions = json.loads(plan.stdout)["actions"] if plan.returncode == 0 else []
        check("the plan gives llm-5's migration a budget of 8 s (the policy's budget_min)",
              [(a["action"], a.get("budget_ms")) for a in actions] == [("live-migrate", 8000)], plan.stdout)
        cut = cut_mid_migration(f, "llm-5")
        if cut is None:
            return
        w, _, _, cut_unix_ms = cut
        rc = w.finish(120)
        text = w.text()
        migrates = [j for j in f.jobs("gpu-a") if j["kind"] == "migrate" and j["vm"] == "llm-5"]
        job = json.dumps(migrates)
        check("gpu-a's migrate job ran under that budget (its error names max total 8 s)",
              len(migrates) == 1 and "beyond max total 8 s" in job, job[:3000])
        check("it failed over its budget, the source running with its memory intact",
              len(migrates) == 1 and migrates[0]["state"] == "failed" and "RUNNING with its memory intact" in job
              and "time budget" in job, job[:3000])
        if migrates and migrates[0].get("ended_unix_ms"):
            after = (migrates[0]["ended_unix_ms"] - cut_unix_ms) / 1000
            check(f"the migration ended {after:.1f} s after the cut (within 5 s)", after < 5, job[:3000])
        report = json.loads(w.out) if w.out.strip() else {}
        outcome = {v["vm"]: v for v in report.get("vms", [])}.get("llm-5", {})
        check("the evacuation re-planned llm-5: blocked, with the reason (exit 1)",
              rc == 1 and outcome.get("outcome") == "blocked" and "re-planned the VMs left after" in text,
              f"exit {rc}: {outcome} {text[-2000:]}")
        check("llm-5 runs on at gpu-a", f.vms_on("gpu-a") == ["llm-5"], str(f.vms_on("gpu-a")))


def slow_link(binary):
    print("-- 7. a link slower than the inventory says: learned from the first migration, the rest re-planned",
          flush=True)
    sim = "sim:size=16MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s"
    hosts = {
        "gpu-a": {"gpus": mig_gpus("mig"), "vms": [vm("llm-6", sim, "1g.10gb", 0), vm("llm-7", sim, "1g.10gb", 1)]},
        "gpu-b": {"gpus": mig_gpus("mig")},
    }
    est = subprocess.run([binary, "estimate", "--device", sim, "--link", "200Mbit", "--json"], capture_output=True,
                         text=True, timeout=300)
    if not check("the VMs' estimate at 200 Mbit", est.returncode == 0, est.stderr[-1500:]):
        return
    inv_vms = [dict(v, host="gpu-a", estimate=json.loads(est.stdout)) for v in
               ({"name": n, "gpus": [0], "profile": "1g.10gb", "placement": p, "class": "inference"}
                for n, p in (("llm-6", 0), ("llm-7", 1)))]
    # The inventory says 200 Mbit; tc gives 40 Mbit. One migration at a time.
    with Fleet(binary, hosts, rate="40mbit", link="200Mbit", max_migrations=1, inventory_vms=inv_vms) as f:
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--yes", "--json", "--store", f"{f.tmp}/store", "--poll", "100ms"),
                      timeout=240)
        text = r.stderr
        check("the evacuation completes (exit 0)", r.returncode == 0, f"exit {r.returncode}: {text[-3000:]}")
        learned = re.search(r"gpu-a's link carried ([0-9.]+) MB/s for (llm-.) \(planned ([0-9.]+) MB/s.*"
                            r"re-planning the VMs left at ([0-9.]+) (MB/s|Mbit)", text)
        check("after the first migration the controller learned gpu-a's link was slower than planned",
              learned is not None, text[-3000:])
        if learned:
            first = learned.group(2)
            second = "llm-7" if first == "llm-6" else "llm-6"
            stuns = re.findall(rf"{second} +live-migrate +-> gpu-b +predicted stun ([0-9.]+) s", text)
            check(f"{second}'s predicted stun, planned again at the learned rate, is longer than at 200 Mbit",
                  len(stuns) >= 2 and float(stuns[-1]) > float(stuns[0]), str(stuns))
        # Planned again while the first was between its source's release and its target's listing: its
        # slot still counted as taken, never given to the second.
        check("no target refused a slot the re-plan gave twice", "refused to receive" not in text, text[-3000:])
        check("gpu-a is empty", f.vms_on("gpu-a") == [], str(f.vms_on("gpu-a")))


def race(binary):
    print("-- 5. two controllers on one etcd store race for the last free slot", flush=True)
    if shutil.which("etcd") is None:
        check("etcd is installed (scripts/bootstrap installs etcd-server)", False)
        return
    sim = "sim:size=16MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s"
    small = "sim:size=4MiB"
    hosts = {
        "gpu-a": {"gpus": mig_gpus("mig"), "vms": [vm("llm-1", sim, "3g.40gb", 0)]},
        "gpu-b": {"gpus": mig_gpus("mig"), "vms": [vm("res-b", small, "3g.40gb", 0)]},
        "gpu-c": {"gpus": mig_gpus("mig"), "vms": [vm("llm-2", sim, "3g.40gb", 0)]},
        "gpu-d": {"gpus": mig_gpus("mig"), "vms": [vm("res-d", small, "3g.40gb", 0)]},
    }
    with Fleet(binary, hosts) as f:
        url = "http://127.0.0.1:2379"
        etcd = f.popen_ctl(["etcd", "--data-dir", f"{f.tmp}/etcd", "--listen-client-urls", url,
                            "--advertise-client-urls", url, "--listen-peer-urls", "http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                            "--initial-cluster", "default=http://127.0.0.1:2380"],
                           stdout=subprocess.DEVNULL, stderr=open(f"{f.tmp}/etcd.log", "w"))
        try:
            probe = f"import urllib.request; urllib.request.urlopen('{url}/health', timeout=1)"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and f.run_ctl(["python3", "-c", probe], capture_output=True).returncode:
                time.sleep(0.2)
            # Both hosts leave the pool first (as scripts/maintenance-mode does): neither is the other's target.
            for h in ("gpu-a", "gpu-c"):
                f.call(h, "maintenance", {"enter": True})
            plans = {}
            for h in ("gpu-a", "gpu-c"):
                r = f.run_ctl(f.evacuate_argv(h, "--dry-run", "--json"), capture_output=True, text=True, timeout=60)
                plans[h] = f"{f.tmp}/plan-{h}.json"
                with open(plans[h], "w") as out:
                    out.write(r.stdout)
                actions = json.loads(r.stdout)["actions"] if r.returncode == 0 else []
                check(f"{h}'s plan, made before the other controller ran, takes gpu-b's last free slot",
                      [(a["action"], (a.get("to") or {}).get("host"), (a.get("to") or {}).get("placement"))
                       for a in actions] == [("live-migrate", "gpu-b", 4)], r.stdout + r.stderr)
            ctls = {h: Watch(f, f.evacuate_argv(h, "--plan", plans[h], "--etcd", url, "--id", f"evac-{h}",
                                                "--json", "--poll", "100ms", "--bandwidth", "8MB/s"))
                    for h in ("gpu-a", "gpu-c")}
            rcs = {h: w.finish(180) for h, w in ctls.items()}
            for h, w in ctls.items():
                check(f"the evacuation of {h} completes (exit 0)", rcs[h] == 0, f"exit {rcs[h]}: {w.text()[-3000:]}")
            lost = [h for h, w in ctls.items() if re.search(r"capacity: .*already reserved by evacuation evac-gpu-.",
                                                             w.text())]
            if not check("exactly one controller found the slot reserved by the other", len(lost) == 1,
                         "\n".join(w.text()[-1500:] for w in ctls.values())):
                return
            loser = lost[0]
            winner = "gpu-c" if loser == "gpu-a" else "gpu-a"
            vm_of = {"gpu-a": "llm-1", "gpu-c": "llm-2"}
            text = ctls[loser].text()
            check("the loser re-planned after the refused reservation",
                  "re-planned the VMs left after: capacity:" in text, text[-2000:])
            check(f"and migrated {vm_of[loser]} to gpu-d",
                  re.search(rf"{vm_of[loser]}: live-migrate to gpu-d started", text) is not None, text[-2000:])
            check(f"the winner's {vm_of[winner]} took gpu-b's slot",
                  f.vms_on("gpu-b") == sorted(["res-b", vm_of[winner]]), str(f.vms_on("gpu-b")))
            check(f"the loser's {vm_of[loser]} is on gpu-d",
                  f.vms_on("gpu-d") == sorted(["res-d", vm_of[loser]]), str(f.vms_on("gpu-d")))
            for h in ("gpu-a", "gpu-c"):
                migrates = [j for j in f.jobs(h) if j["kind"] == "migrate"]
                check(f"{vm_of[h]} was migrated exactly once", [j["state"] for j in migrates] == ["completed"],
                      str([(j["id"], j["state"]) for j in migrates]))
                check(f"{h} is empty", f.vms_on(h) == [], str(f.vms_on(h)))
        finally:
            etcd.terminate()
            try:
                etcd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                etcd.kill()
                etcd.wait()


def status_watch(binary):
    print("-- 8. `gpumigrate status --watch` follows a running evacuation from another terminal (tmux)", flush=True)
    sim = "sim:size=12MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s"  # about 8 s at 2 MB/s
    hosts = {"gpu-a": {"gpus": mig_gpus("mig"), "vms": [vm("llm-8", sim, "1g.10gb", 0)]},
             "gpu-b": {"gpus": mig_gpus("mig")}}
    tmux = shutil.which("tmux")
    if not check("tmux is installed (scripts/bootstrap)", tmux is not None):
        return
    with Fleet(binary, hosts) as f:
        sock = f"{f.tmp}/tmux.sock"
        env = dict(f.env or os.environ, TERM="xterm")
        store = f"{f.tmp}/store"
        w = Watch(f, f.evacuate_argv("gpu-a", "--yes", "--id", "evac-w", "--store", store, "--poll", "100ms",
                                     "--bandwidth", "2MB/s"))
        t, _ = w.wait_for(r"llm-8: live-migrate to gpu-b started", 60)
        if not check("the evacuation started", t is not None, w.text()):
            w.finish(10)
            return
        status = [binary, "status", "--watch", "--interval", "300ms", "--store", store, "--id", "evac-w",
                  "--inventory", f.inventory, *f.ctl_tls()]
        try:
            r = f.run_ctl([tmux, "-S", sock, "new-session", "-d", "-x", "200", "-y", "30", shlex.join(status)],
                          env=env, timeout=10)
            check("tmux runs `gpumigrate status --watch` in the controller's namespace", r.returncode == 0, r.stderr)

            def capture():
                c = subprocess.run([tmux, "-S", sock, "capture-pane", "-p"], capture_output=True, text=True, timeout=10)
                return c.stdout

            def screen_with(pattern, seconds):
                """The pane once it shows `pattern`, or as it is after `seconds`."""
                screen, deadline = "", time.monotonic() + seconds
                while time.monotonic() < deadline:
                    screen = capture()
                    if re.search(pattern, screen):
                        break
                    time.sleep(0.2)
                return screen

            screen = screen_with(r"llm-8 +live-migrate +gpu-b +started .*round-.* MB/s", 20)
            check("its screen shows llm-8 started, its round and rate from gpu-a's agent",
                  re.search(r"llm-8 +live-migrate +gpu-b +started +1 +round-\S+ r\d+ [0-9.]+ \S+ [0-9.]+ MB/s", screen)
                  is not None, screen + "\ngpu-a's jobs: " + json.dumps(f.call("gpu-a", "status").get("jobs"))[:1500])
            check("under a header that says how it refreshes", "gpumigrate status" in screen and "Ctrl-C" in screen,
                  screen)
            rc = w.finish(120)
            check("the evacuation completed", rc == 0, w.text()[-2000:])
            screen = screen_with(r"llm-8 +live-migrate +gpu-b +completed", 10)
            check("and the redrawn screen shows it completed, with its stun",
                  re.search(r"llm-8 +live-migrate +gpu-b +completed +1 +stun [0-9.]+ ms", screen) is not None, screen)
            check("redrawn in place: one header on the screen", screen.count("gpumigrate status") == 1, screen)
        finally:
            subprocess.run([tmux, "-S", sock, "kill-server"], capture_output=True, timeout=10)


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__[__doc__.index("Usage:"):].strip(), file=sys.stderr)
        return 2
    why = cluster.available()
    if why:
        print(f"evacuation_test: skipped: {why}", file=sys.stderr)
        return 77
    binary = os.path.abspath(sys.argv[1])
    workload = os.path.abspath(sys.argv[2]) if len(sys.argv) == 3 else os.path.join(os.path.dirname(binary),
                                                                                      "gpumigrate-workload")
    os.environ.setdefault("GPUMIGRATE_CALIBRATION", f"/tmp/gm-evacuation-test-{os.getpid()}-calibration.json")
    t0 = time.monotonic()
    try:
        scenarios = (collapse, controller_killed, refusals_and_target_killed, proc_vm, race, budget, slow_link,
                     status_watch)
        # GM_CLUSTER_SCENARIOS=name,name runs only those.
        only = [n for n in os.environ.get("GM_CLUSTER_SCENARIOS", "").split(",") if n]
        unknown = set(only) - {f.__name__ for f in scenarios}
        if unknown:
            print(f"evacuation_test: unknown scenarios {sorted(unknown)}", file=sys.stderr)
            return 2
        for scenario in scenarios:
            if only and scenario.__name__ not in only:
                continue
            try:
                scenario(binary, workload) if scenario is proc_vm else scenario(binary)
            except Exception as e:  # a scenario's harness failed: say so, go on to the next
                check(f"{scenario.__name__} ran", False, repr(e))
    finally:
        try:
            os.unlink(os.environ["GPUMIGRATE_CALIBRATION"])
        except OSError:
            pass
    print(f"{len(failures)} failed, {time.monotonic() - t0:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
