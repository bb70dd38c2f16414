#!/usr/bin/env python3
"""A cluster of "hosts" on one machine, for the evacuation tests (issue 12).

Each host is a network namespace with one interface, eth0, joined by a veth pair
to a bridge that lives in a namespace of its own; no address or interface is
added outside the namespaces the harness creates. Each host's link is shaped
with tc tbf in both directions (eth0's egress in the host, the bridge port's
egress for what the host receives), and can be re-shaped while traffic flows
(set_rate: a link that collapses). Everything is named gmc<PID>-..., removed
on stop(), at exit and on SIGTERM/SIGINT; `cluster.py sweep` removes what a
harness killed with SIGKILL left behind (namespaces whose PID is gone).

    with Cluster(["gpu-a", "gpu-b"], rate="400mbit") as c:
        p = c.popen("gpu-b", ["gpumigrate", "receive", "--listen", f"{c.addr('gpu-b')}:7070", ...])
        c.run("gpu-a", ["gpumigrate", "migrate", "--to", f"{c.addr('gpu-b')}:7070", ...])
        c.set_rate("gpu-a", "20mbit")

Needs root, iproute2 (ip, tc, bridge).
Usage as a command: cluster.py sweep | cluster.py demo HOST... (builds, lists, waits for Enter, removes)
"""
import atexit
import os
import re
import signal
import subprocess
import sys

SUBNET = "10.77.0"  # inside the cluster's own namespaces only
PREFIX = "gmc"


def sh(*argv, check=True):
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def netns_list():
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def available():
    """None when a cluster can be built here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"{tool} is not installed (iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = sh("ip", "netns", "add", probe, check=False)
    sh("ip", "netns", "del", probe, check=False)
    if r.returncode != 0:
        return f"this machine refuses network namespaces: ip netns add: {r.stderr.strip()}"
    return None


class Cluster:
    def __init__(self, hosts, rate="1gbit", burst="256kb", latency="50ms"):
        if len(hosts) > 200 or len(set(hosts)) != len(hosts):
            raise ValueError("hosts: at most 200 distinct names")
        for h in hosts:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}", h):
                raise ValueError(f"host name {h!r}: letters, digits, '.', '_', '-'")
        self.hosts = list(hosts)
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge_ns = f"{self.tag}-bridge"
        self.rates = {h: rate for h in hosts}
        self.burst, self.latency = burst, latency
        self.procs = []
        self.started = False

    # -- names and addresses ------------------------------------------------
    def ns(self, host):
        return f"{self.tag}-{host}"

    def addr(self, host):
        return f"{SUBNET}.{self.hosts.index(host) + 1}"

    def _port(self, host):  # the bridge side of the host's veth (15 characters at most)
        return f"p{os.getpid() % 100000}x{self.hosts.index(host)}"

    # -- life ----------------------------------------------------------------
    def start(self):
        atexit.register(self.stop)
        for s in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(s)

            def on_signal(signum, frame, previous=previous):
                self.stop()
                if callable(previous):
                    previous(signum, frame)
                else:
                    sys.exit(128 + signum)
            signal.signal(s, on_signal)
        self.started = True
        try:
            sh("ip", "netns", "add", self.bridge_ns)
            self._in(self.bridge_ns, "ip", "link", "set", "lo", "up")
            self._in(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge")
            self._in(self.bridge_ns, "ip", "link", "set", "br0", "up")
            for h in self.hosts:
                ns, port = self.ns(h), self._port(h)
                sh("ip", "netns", "add", ns)
                # Made inside the bridge's namespace, then one end moved: nothing
                # ever appears in the namespace the tests run in.
                self._in(self.bridge_ns, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0",
                         "netns", ns)
                self._in(self.bridge_ns, "ip", "link", "set", port, "master", "br0")
                self._in(self.bridge_ns, "ip", "link", "set", port, "up")
                self._in(ns, "ip", "link", "set", "lo", "up")
                self._in(ns, "ip", "addr", "add", f"{self.addr(h)}/24", "dev", "eth0")
                self._in(ns, "ip", "link", "set", "eth0", "up")
                self.set_rate(h, self.rates[h])
        except Exception:
            self.stop()
            raise
        return self

    def stop(self):
        if not self.started:
            return
        self.started = False
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for h in self.hosts:
            sh("ip", "netns", "del", self.ns(h), check=False)  # its eth0 and the veth's other end go too
        sh("ip", "netns", "del", self.bridge_ns, check=False)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- links ---------------------------------------------------------------
    def set_rate(self, host, rate):
        """Shapes the host's link both ways to `rate` (tc syntax: 400mbit, 2gbit)."""
        tbf = ["tbf", "rate", rate, "burst", self.burst, "latency", self.latency]
        self._in(self.ns(host), "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf)
        self._in(self.bridge_ns, "tc", "qdisc", "replace", "dev", self._port(host), "root", *tbf)
        self.rates[host] = rate

    def qdisc(self, host):
        return self._in(self.ns(host), "tc", "qdisc", "show", "dev", "eth0").stdout

    # -- running things in a host -------------------------------------------
    def argv(self, host, argv):
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def run(self, host, argv, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(self.argv(host, argv), **kw)

    def popen(self, host, argv, **kw):
        p = subprocess.Popen(self.argv(host, argv), **kw)
        self.procs.append(p)
        return p

    def _in(self, ns, *argv):
        return sh("ip", "netns", "exec", ns, *argv)


def sweep():
    """Removes the namespaces of harnesses whose process is gone; returns their names."""
    gone = []
    for ns in netns_list():
        m = re.fullmatch(rf"{PREFIX}(\d+)-.+", ns)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            sh("ip", "netns", "del", ns, check=False)
            gone.append(ns)
    return gone


def main(argv):
    if len(argv) >= 2 and argv[1] == "sweep":
        for ns in sweep():
            print(f"removed {ns}")
        return 0
    if len(argv) >= 3 and argv[1] == "demo":
        why = available()
        if why:
            print(f"cluster.py: {why}", file=sys.stderr)
            return 2
        with Cluster(argv[2:], rate="400mbit") as c:
            for h in c.hosts:
                print(f"{h}: namespace {c.ns(h)}, {c.addr(h)}, {c.rates[h]}")
            input("press Enter to remove the cluster ")
        return 0
    print(__doc__.strip().splitlines()[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
