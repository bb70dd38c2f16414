#!/usr/bin/env python3
"""Agents' /metrics scraped by a real Prometheus (Debian's), during a real
migration between two agents on loopback (issue 43 item 1).

gpu-a serves /metrics over plain HTTP, gpu-b over HTTPS with client
certificates (--metrics-tls: Prometheus scrapes it with a certificate the
agents' CA signed). Prometheus, started here on loopback with a scrape config
written here (every 250 ms), must return through its query API: the running
migration's bytes sent, phase, rate and dirty set from gpu-a, gpu-b's receive in
flight, and, after it, gpu-a's completed-migration counter and the measured
stun. The page passes `promtool check metrics`. Bounded in time; everything
started is stopped, the temporary directory removed.

Usage: metrics_prometheus_test.py GPUMIGRATE   (exit 77: no prometheus binary)
"""
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
failures = 0


def check(what, ok, detail=""):
    global failures
    if ok:
        print(f"ok: {what}", flush=True)
    else:
        failures += 1
        print(f"FAIL: {what}" + (f": {detail}" if detail else ""), flush=True)
    return ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_file(path, seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        time.sleep(0.05)
    return None


class Test:
    def __init__(self, binary, tmp):
        self.bin, self.tmp = binary, tmp
        self.procs = []
        self.pki = f"{tmp}/pki"
        subprocess.run([f"{ROOT}/scripts/make-test-certs", self.pki, "127.0.0.1"], check=True,
                       stderr=subprocess.DEVNULL)
        self.ctl = ["--tls-ca", f"{self.pki}/ca.pem", "--tls-cert", f"{self.pki}/source.pem",
                    "--tls-key", f"{self.pki}/source.key"]

    def start(self, argv, log):
        p = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def agent(self, name, cert, config, tls_metrics):
        with open(f"{self.tmp}/{name}.json", "w") as f:
            json.dump(config, f)
        argv = [self.bin, "agent", "--config", f"{self.tmp}/{name}.json", "--listen", "127.0.0.1:0",
                "--port-file", f"{self.tmp}/{name}.port", "--state-dir", f"{self.tmp}/{name}",
                "--tls-ca", f"{self.pki}/ca.pem", "--tls-cert", f"{self.pki}/{cert}.pem",
                "--tls-key", f"{self.pki}/{cert}.key",
                "--metrics-listen", "127.0.0.1:0", "--metrics-port-file", f"{self.tmp}/{name}.mport"]
        if tls_metrics:
            argv.append("--metrics-tls")
        self.start(argv, f"{self.tmp}/{name}.log")
        port, mport = wait_file(f"{self.tmp}/{name}.port", 10), wait_file(f"{self.tmp}/{name}.mport", 10)
        if port is None or mport is None:
            raise RuntimeError(f"agent {name} did not start: {open(self.tmp + '/' + name + '.log').read()}")
        return f"127.0.0.1:{port}", int(mport)

    def call(self, addr, op, body=None):
        r = subprocess.run([self.bin, "agent-call", "--agent", addr, *self.ctl, op, json.dumps(body or {})],
                           capture_output=True, text=True, timeout=60)
        reply = json.loads(r.stdout) if r.stdout.strip() else {}
        if r.returncode != 0:
            raise RuntimeError(f"{op} on {addr}: exit {r.returncode}: {r.stderr.strip()}")
        return reply

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # The agents' children (their own sessions): from the state files.
        for name in ("a", "b"):
            try:
                for j in json.load(open(f"{self.tmp}/{name}/state.json"))["jobs"]:
                    os.killpg(j["pid"], signal.SIGKILL)
            except Exception:
                pass


def query(prom, q):
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    return body["data"]["result"] if body.get("status") == "success" else []


def value(prom, q):
    """The query's single value now, or None."""
    try:
        res = query(prom, q)
    except Exception:
        return None
    return float(res[0]["value"][1]) if len(res) == 1 else None


def wait_value(prom, q, pred, seconds):
    until = time.monotonic() + seconds
    v = None
    while time.monotonic() < until:
        v = value(prom, q)
        if v is not None and pred(v):
            return v
        time.sleep(0.2)
    return v


def main():
    binary = sys.argv[1]
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None:
        print("metrics_prometheus_test: skipped: no prometheus binary (apt-get install prometheus)")
        return 77
    tmp = tempfile.mkdtemp(prefix="gm-metrics-")
    t = Test(binary, tmp)
    try:
        mig = {"index": 0, "model": "H100-80GB", "mode": "mig"}
        a_addr, a_metrics = t.agent("a", "source", {
            "version": 1, "host": {"name": "gpu-a", "link": "10Gbit", "max_migrations": 2, "gpus": [mig]},
            "vms": [{"name": "llm-1", "device": "sim:size=32MiB,static=0.9,hot=1MiB,kv_rate=1MiB/s", "gpus": [0],
                     "profile": "3g.40gb", "placement": 0, "class": "inference"}]}, False)
        b_addr, b_metrics = t.agent("b", "dest", {
            "version": 1, "host": {"name": "gpu-b", "link": "10Gbit", "max_migrations": 1, "gpus": [mig]},
            "vms": []}, True)

        # The pages themselves: plain HTTP for gpu-a, HTTPS with a client certificate for gpu-b.
        page = urllib.request.urlopen(f"http://127.0.0.1:{a_metrics}/metrics", timeout=5).read().decode()
        check("gpu-a serves /metrics over HTTP", 'gpumigrate_host_vms{host="gpu-a"} 1' in page, page[:500])
        if promtool:
            lint = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)
            check("promtool finds nothing to fault in the page", lint.returncode == 0, lint.stdout + lint.stderr)
        readme = open(os.path.join(ROOT, "docs/evacuation.md")).read()
        families = [line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")]
        undocumented = [f for f in families if f"`{f}" not in readme]
        check(f"every family of the page ({len(families)}) is in the README's table", families and not undocumented,
              str(undocumented))
        ctx = ssl.create_default_context(cafile=f"{t.pki}/ca.pem")
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{b_metrics}/metrics", timeout=5, context=ctx).read()
            check("gpu-b refuses a scrape without a client certificate", False)
        except Exception as e:  # the handshake fails or the connection is reset
            check("gpu-b refuses a scrape without a client certificate", True, str(e))
        ctx.load_cert_chain(f"{t.pki}/source.pem", f"{t.pki}/source.key")
        page_b = urllib.request.urlopen(f"https://127.0.0.1:{b_metrics}/metrics", timeout=5, context=ctx).read().decode()
        check("gpu-b serves /metrics over HTTPS to a client the CA signed", 'gpumigrate_host_vms{host="gpu-b"} 0' in page_b,
              page_b[:500])

        # Prometheus on loopback, scraping both every 250 ms.
        prom = free_port()
        with open(f"{tmp}/prometheus.yml", "w") as f:
            f.write(f"""global:
  scrape_interval: 250ms
  scrape_timeout: 200ms
scrape_configs:
  - job_name: gpumigrate-plain
    static_configs:
      - targets: ["127.0.0.1:{a_metrics}"]
  - job_name: gpumigrate-tls
    scheme: https
    tls_config:
      ca_file: {t.pki}/ca.pem
      cert_file: {t.pki}/source.pem
      key_file: {t.pki}/source.key
    static_configs:
      - targets: ["127.0.0.1:{b_metrics}"]
""")
        t.start([prometheus, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
                 f"--web.listen-address=127.0.0.1:{prom}"], f"{tmp}/prometheus.log")
        up = wait_value(prom, 'sum(up{job=~"gpumigrate-.*"})', lambda v: v == 2, 30)
        if not check("Prometheus scrapes both agents (up == 1 for each)", up == 2,
                     f"up={up}; {open(tmp + '/prometheus.log').read()[-2000:]}"):
            return 1

        # A migration paced so it lasts several scrapes: 32 MiB at 4 MB/s.
        inv = t.call(a_addr, "inventory")
        v = [v for v in inv["vms"] if v["name"] == "llm-1"][0]
        dev = v.pop("device")
        v.pop("host")
        r = t.call(b_addr, "receive", {"vm": {"name": "llm-1", "device": dev, "inventory": v}, "gpus": [0],
                                       "placement": 0})
        m = t.call(a_addr, "migrate", {"vm": "llm-1", "to": f"127.0.0.1:{r['port']}",
                                       "options": {"bandwidth": "4MB/s", "warmup": "100ms"}})
        sent = wait_value(prom, 'gpumigrate_migration_sent_bytes_total{host="gpu-a",vm="llm-1",direction="out"}',
                          lambda x: x > 1e6, 30)
        check("Prometheus has the running migration's bytes sent", sent is not None and sent > 1e6, f"{sent}")
        phase = wait_value(prom, 'sum(gpumigrate_migration_phase{host="gpu-a",vm="llm-1",phase=~"round-.*"})',
                           lambda x: x == 1, 10)
        check("and its phase (a pre-copy round)", phase == 1, f"{phase}")
        rate = wait_value(prom, 'gpumigrate_migration_rate_bytes_per_second{host="gpu-a",vm="llm-1"}',
                          lambda x: 1e6 < x < 8e6, 10)
        check("and its rate, near the 4 MB/s cap", rate is not None and 1e6 < rate < 8e6, f"{rate}")
        dirty = value(prom, 'gpumigrate_migration_dirty_bytes{host="gpu-a",vm="llm-1"}')
        check("and the bytes its round considers", dirty is not None and dirty > 0, f"{dirty}")
        inflight = wait_value(prom, 'gpumigrate_host_migrations_in_flight{host="gpu-b",direction="in"}',
                              lambda x: x == 1, 10)
        check("gpu-b's receive in flight, scraped over HTTPS", inflight == 1, f"{inflight}")
        applied = wait_value(prom, 'gpumigrate_migration_applied_bytes_total{host="gpu-b",vm="llm-1",direction="in"}',
                             lambda x: x > 1e6, 20)
        check("and the bytes it has applied there", applied is not None and applied > 1e6, f"{applied}")
        predicted = wait_value(prom, 'gpumigrate_migration_predicted_stun_seconds{host="gpu-a",vm="llm-1"}',
                               lambda x: x > 0, 20)
        check("gpu-a's migration, once a round has ended, says the stun it predicts", predicted is not None and predicted > 0,
              f"{predicted}")

        # After: the outcome counter and the measured stun.
        deadline = time.monotonic() + 90
        state = "running"
        while time.monotonic() < deadline and state == "running":
            state = t.call(a_addr, "status", {"job": m["job"]})["jobs"][0]["state"]
            time.sleep(0.3)
        check("the migration completed", state == "completed", state)
        done = wait_value(prom, 'gpumigrate_migrations_total{host="gpu-a",direction="out",outcome="completed"}',
                          lambda x: x == 1, 15)
        check("Prometheus counts it completed", done == 1, f"{done}")
        stun = wait_value(prom, 'gpumigrate_migration_last_stun_seconds{host="gpu-a",vm="llm-1"}', lambda x: x > 0, 10)
        report = t.call(a_addr, "status", {"job": m["job"]})["jobs"][0].get("report", {})
        check("and its measured stun, the report's", stun is not None and report.get("stun_ms") is not None and
              abs(stun * 1000 - report["stun_ms"]) < 0.01, f"{stun} vs {report.get('stun_ms')}")
        vms_b = wait_value(prom, 'gpumigrate_host_vms{host="gpu-b"}', lambda x: x == 1, 15)
        check("gpu-b runs llm-1 now", vms_b == 1, f"{vms_b}")
        free = value(prom, 'gpumigrate_gpu_mig_slices_free{host="gpu-a",gpu="0"}')
        check("gpu-a's GPU has its slices free again", free == 8, f"{free}")
    finally:
        t.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
