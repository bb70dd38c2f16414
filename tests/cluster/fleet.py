#!/usr/bin/env python3
"""An agent fleet on a cluster of namespaces (cluster.py), for the evacuation
tests, scripts/cluster-demo and perf/evacuate.py.

Every host runs one `gpumigrate agent` over mutual TLS (a throwaway CA from
scripts/make-test-certs), with the group hooks and power-off hook set to
commands that append "start VM on HOST", "drain VM on HOST" or "power-off VM on
HOST" to hooks.log, so a test can check their order. A controller namespace,
"ctl", runs `evacuate` and `agent-call`. The inventory the controller reads
names every host with its agent's address.

    hosts = {"gpu-a": {"gpus": [...], "vms": [...]}, "gpu-b": {"gpus": [...]}}

A host may run processes of its own before its agent starts ("processes":
{NAME: argv}, each in the host's namespace, e.g. a gpumigrate-workload): the
first "ready pid=PID" line each prints replaces "{pid:NAME}" in its VMs'
device specs, so a proc VM is configured as "proc:{pid:NAME}". `adopters`
(the agents' "adopters", README "gpumigrate agent") goes to every host, so a VM
whose receive_device is "adopt:NAME" can be received anywhere.
    with Fleet(binary, hosts, rate="200mbit", groups=[...]) as f:
        f.call("gpu-a", "inventory")
        r = f.run_ctl(f.evacuate_argv("gpu-a", "--yes", "--json"))

Everything it starts or writes goes when it stops: the agents, the migrations
they run (each in a session of its own), the namespaces and its directory.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORT = 7070


def mig_gpus(*modes, model="H100-80GB"):
    return [{"index": i, "model": model, "mode": m} for i, m in enumerate(modes)]


class Fleet:
    def __init__(self, binary, hosts, rate="200mbit", link="100Gbit", groups=(), policy=None, inventory_vms=(),
                 max_migrations=2, env=None, adopters=None):
        self.binary = binary
        self.spec = hosts  # name -> {"gpus": [...], "vms": [...]} (the agent's own VMs)
        self.names = list(hosts)
        self.groups = list(groups)
        self.policy = policy or {"max_stun": "100s"}
        self.inventory_vms = list(inventory_vms)
        self.link, self.max_migrations = link, max_migrations
        self.env = env
        self.adopters = adopters or {}
        self.processes = {}  # (host, name) -> (Popen, pid)
        self.cluster = cluster.Cluster(self.names + ["ctl"], rate=rate)
        self.tmp = tempfile.mkdtemp(prefix="gm-fleet-")
        self.agents = {}
        self.pki = f"{self.tmp}/pki"

    # -- life ----------------------------------------------------------------
    def start(self):
        try:
            self.cluster.start()
            subprocess.run([os.path.join(REPO, "scripts", "make-test-certs"), self.pki,
                            *[self.addr(h) for h in self.names + ["ctl"]]], check=True, stderr=subprocess.DEVNULL)
            for h in self.names:
                self.start_processes(h)
            for h in self.names:
                self.start_agent(h)
            self.write_inventory()
            deadline = time.time() + 30
            while time.time() < deadline and not all(os.path.exists(self._port_file(h)) for h in self.names):
                time.sleep(0.05)
            missing = [h for h in self.names if not os.path.exists(self._port_file(h))]
            if missing:
                raise RuntimeError(f"agents did not start on {', '.join(missing)}: "
                                   + "; ".join(self.log(h)[-500:] for h in missing))
        except Exception:
            self.stop()
            raise
        return self

    def stop(self):
        for h in self.names:
            self.kill_jobs(h, adopters=True)
        self.cluster.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- agents --------------------------------------------------------------
    def addr(self, host):
        return self.cluster.addr(host)

    def agent_tls(self):
        return ["--tls-ca", f"{self.pki}/ca.pem", "--tls-cert", f"{self.pki}/dest.pem",
                "--tls-key", f"{self.pki}/dest.key"]

    def ctl_tls(self, pki=None):
        pki = pki or self.pki
        return ["--tls-ca", f"{pki}/ca.pem", "--tls-cert", f"{pki}/source.pem", "--tls-key", f"{pki}/source.key"]

    def host_entry(self, host):
        return {"name": host, "link": self.link, "max_migrations": self.max_migrations,
                "gpus": self.spec[host]["gpus"]}

    def _hook(self, what):
        return ["sh", "-c", f"echo {what} $0 on $1 >> {self.tmp}/hooks.log", "{vm}", "{host}"]

    def _port_file(self, host):
        return f"{self.tmp}/{host}.port"

    def start_processes(self, host):
        for name, argv in self.spec[host].get("processes", {}).items():
            p = self.cluster.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            line = p.stdout.readline()  # ip netns exec execs the command: p.pid is the process
            if not line.startswith("ready pid="):
                raise RuntimeError(f"{name} on {host} did not start: {line!r} (exit {p.poll()})")
            self.processes[(host, name)] = (p, int(line.split()[1].split("=")[1]))
            for v in self.spec[host].get("vms", []):
                v["device"] = v["device"].replace("{pid:%s}" % name, str(self.processes[(host, name)][1]))

    def process(self, host, name):
        """A process the host started before its agent (its Popen: stdout is the rest of its output)."""
        return self.processes[(host, name)][0]

    def start_agent(self, host):
        hooks = {"start_replica": self._hook("start"), "drain": self._hook("drain")}
        cfg = {"version": 1, "host": self.host_entry(host), "data_address": self.addr(host),
               "groups": [dict(g, hooks=hooks) for g in self.groups], "vms": self.spec[host].get("vms", []),
               "power_off": self._hook("power-off"), "adopters": self.adopters}
        with open(f"{self.tmp}/{host}.json", "w") as f:
            json.dump(cfg, f)
        log = open(f"{self.tmp}/{host}.log", "a")
        self.agents[host] = self.cluster.popen(
            host, [self.binary, "agent", "--config", f"{self.tmp}/{host}.json", "--listen", f"{self.addr(host)}:{PORT}",
                   "--state-dir", f"{self.tmp}/{host}", "--port-file", self._port_file(host), *self.agent_tls()],
            stdout=log, stderr=log, env=self.env)

    def kill_agent(self, host):
        """SIGKILL: the agent and the migrations it runs, as a host that dies."""
        self.agents[host].kill()
        self.agents[host].wait()
        self.kill_jobs(host)

    def jobs(self, host):
        try:
            with open(f"{self.tmp}/{host}/state.json") as f:
                return json.load(f)["jobs"]
        except (OSError, ValueError, KeyError):
            return []

    def kill_jobs(self, host, adopters=False):
        """The host's running jobs (each a session of its own), and with `adopters` every adopter it started
        (the processes VMs received here run in, running jobs or not)."""
        for j in self.jobs(host):
            groups = [j.get("pid", 0)] if j.get("state") == "running" else []
            if adopters or j.get("state") == "running":
                groups.append(j.get("adopter_pid", 0))
            for g in groups:
                if g > 0:
                    try:
                        os.killpg(g, signal.SIGKILL)
                    except OSError:
                        pass

    def adopter_output(self, host, vm):
        """What the adopter a receive of `vm` started on `host` printed (stdout), "" when none did."""
        for j in self.jobs(host):
            if j.get("vm") == vm and j.get("adopter_pid", 0) > 0:
                try:
                    with open(f"{self.tmp}/{host}/jobs/{j['id']}.adopter.out") as f:
                        return f.read()
                except OSError:
                    pass
        return ""

    def log(self, host):
        try:
            with open(f"{self.tmp}/{host}.log") as f:
                return f.read()
        except OSError:
            return ""

    def hooks(self):
        try:
            with open(f"{self.tmp}/hooks.log") as f:
                return [line for line in f.read().split("\n") if line]
        except OSError:
            return []

    # -- the controller ------------------------------------------------------
    @property
    def inventory(self):
        return f"{self.tmp}/fleet.json"

    def write_inventory(self):
        inv = {"version": 1, "policy": self.policy,
               "hosts": [dict(self.host_entry(h), agent=f"{self.addr(h)}:{PORT}") for h in self.names],
               "groups": self.groups, "vms": self.inventory_vms}
        with open(self.inventory, "w") as f:
            json.dump(inv, f)

    def run_ctl(self, argv, **kw):
        kw.setdefault("env", self.env)
        return self.cluster.run("ctl", argv, **kw)

    def popen_ctl(self, argv, **kw):
        kw.setdefault("env", self.env)
        return self.cluster.popen("ctl", argv, **kw)

    def call(self, host, op, body=None, pki=None):
        """agent-call from the controller: the reply as a dict ({"ok": False, "error": ...} when none came)."""
        r = self.run_ctl([self.binary, "agent-call", "--agent", f"{self.addr(host)}:{PORT}", *self.ctl_tls(pki), op,
                          json.dumps(body or {})], timeout=60)
        if r.stdout.strip():
            try:
                return json.loads(r.stdout)
            except ValueError:
                pass
        return {"ok": False, "error": (r.stderr or r.stdout).strip(), "exit": r.returncode}

    def vms_on(self, host):
        """The VM names the host's agent lists, sorted; None when it does not answer."""
        r = self.call(host, "inventory")
        return sorted(v["name"] for v in r["vms"]) if r.get("ok") else None

    def evacuate_argv(self, host, *args, pki=None):
        return [self.binary, "evacuate", "--inventory", self.inventory, "--host", host, *self.ctl_tls(pki), *args]
