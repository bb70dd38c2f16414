#!/usr/bin/env python3
"""The cluster harness (tests/cluster/cluster.py) does what the evacuation tests
will rely on:
  - hosts reach each other at their addresses and nothing else: the namespace
    this test runs in gains no interface;
  - each link is shaped: a transfer takes at least bytes / rate (a lower bound
    only, so a slow machine cannot fail it), and a rate cut while a host is up
    takes effect (the link that collapses);
  - a real migration runs between two hosts: `gpumigrate receive` in one,
    `migrate` in another, over PSK TLS, and completes;
  - stop() removes every namespace, and `sweep` removes what a harness killed
    with SIGKILL left.
Usage: harness_test.py GPUMIGRATE. Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

failures = []


def check(name, ok, detail=""):
    print(f"{'ok' if ok else 'FAIL'}: {name}{'' if ok else f': {detail}'}", flush=True)
    if not ok:
        failures.append(name)


# Sends N bytes from one host to another; returns (seconds, bytes received).
RECEIVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7001)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 16)
    if not b: break
    n += len(b)
print(n, flush=True)
"""
SENDER = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 7001), timeout=30)
data = b"x" * (1 << 16); left = int(sys.argv[2]); t = time.monotonic()
while left > 0:
    c.sendall(data[:min(left, len(data))]); left -= min(left, len(data))
c.shutdown(socket.SHUT_WR); c.recv(1); print(time.monotonic() - t, flush=True)
"""


def transfer(c, src, dst, nbytes):
    rx = c.popen(dst, [sys.executable, "-c", RECEIVER, c.addr(dst)], stdout=subprocess.PIPE, text=True)
    assert rx.stdout.readline().strip() == "ready"
    t = time.monotonic()
    tx = c.run(src, [sys.executable, "-c", SENDER, c.addr(dst), str(nbytes)], timeout=60)
    got = int(rx.stdout.readline().strip() or 0)
    rx.wait(timeout=10)
    return time.monotonic() - t, got, tx


def main(argv):
    why = cluster.available()
    if why:
        print(f"skip: {why}")
        return 77
    gm = argv[1]
    before_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    with cluster.Cluster(["gpu-a", "gpu-b", "gpu-c"], rate="200mbit") as c:
        names = cluster.netns_list()
        check("a namespace per host and one for the bridge",
              all(c.ns(h) in names for h in c.hosts) and c.bridge_ns in names, names)
        after_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        check("no interface added where the test runs", after_links.count("\n") == before_links.count("\n"),
              after_links)
        r = c.run("gpu-a", ["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
        check("gpu-a has its address", f"{c.addr('gpu-a')}/24" in r.stdout, r.stdout)
        check("gpu-a's link is shaped", "tbf" in c.qdisc("gpu-a") and "200Mbit" in c.qdisc("gpu-a"),
              c.qdisc("gpu-a"))

        # 8 MB at 200 Mbit/s (25 MB/s) takes at least 0.32 s less the 256 KiB burst.
        secs, got, tx = transfer(c, "gpu-a", "gpu-c", 8_000_000)
        check("8 MB from gpu-a reached gpu-c", got == 8_000_000 and tx.returncode == 0, f"{got} {tx.stderr}")
        check("the 200 Mbit link held it back (at least 0.29 s)", secs >= 0.29, f"{secs:.3f} s")
        c.set_rate("gpu-a", "20mbit")
        secs, got, _ = transfer(c, "gpu-a", "gpu-b", 2_000_000)
        check("after the cut to 20 Mbit: 2 MB takes at least 0.7 s", got == 2_000_000 and secs >= 0.7,
              f"{got} bytes in {secs:.3f} s")
        c.set_rate("gpu-a", "400mbit")

        # A real migration between two hosts over PSK TLS.
        work = tempfile.mkdtemp(prefix="gm-cluster-")
        psk = os.path.join(work, "psk")
        with open(psk, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        dev = "sim:size=64MiB,hot=2MiB,kv_rate=16MiB/s,page=16KiB,step=2ms"
        env = dict(os.environ, GPUMIGRATE_CALIBRATION=os.path.join(work, "calibration.json"))
        port_file = os.path.join(work, "port")
        rx = c.popen("gpu-b", [gm, "receive", "--listen", f"{c.addr('gpu-b')}:0", "--port-file", port_file,
                               "--device", dev, "--psk-file", psk, "--json", "--run-after", "50ms",
                               "--accept-timeout", "60s"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        port = ""
        for _ in range(200):  # until it listens
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                port = open(port_file).read().strip()
                break
            time.sleep(0.05)
        check("the receiver listens on gpu-b", bool(port))
        m = c.run("gpu-a", [gm, "migrate", "--device", dev, "--to", f"{c.addr('gpu-b')}:{port}", "--psk-file", psk,
                            "--json", "--warmup", "200ms"], env=env, timeout=120)
        out, err = rx.communicate(timeout=60)
        check("migrate from gpu-a exits 0", m.returncode == 0, m.stderr[-1500:])
        check("receive on gpu-b exits 0", rx.returncode == 0, err[-1500:])
        try:
            rep = json.loads(m.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            rep = {}
        check("the migration completed and verified", rep.get("outcome") == "completed" and rep.get("verified"),
              m.stdout[-800:])
        subprocess.run(["rm", "-rf", work])
    names = cluster.netns_list()
    check("stop removed every namespace", not any(n.startswith(c.tag) for n in names), names)

    # A harness killed with SIGKILL leaves its namespaces; sweep removes them.
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, time; sys.path.insert(0, sys.argv[1]); import cluster; "
                              "c = cluster.Cluster(['x1', 'x2']).start(); print(c.tag, flush=True); time.sleep(60)",
                              os.path.dirname(os.path.abspath(__file__))], stdout=subprocess.PIPE, text=True)
    tag = child.stdout.readline().strip()
    child.kill()
    child.wait()
    left = [n for n in cluster.netns_list() if n.startswith(tag + "-")]
    check("a killed harness leaves its namespaces", len(left) == 3, left)
    gone = cluster.sweep()
    check("sweep removes them", sorted(gone) == sorted(left) and
          not any(n.startswith(tag + "-") for n in cluster.netns_list()), gone)

    print(f"{'FAIL' if failures else 'PASS'}: {len(failures)} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
