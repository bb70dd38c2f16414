"""What the QEMU end-to-end tests share: pass/fail bookkeeping and the two
gpumigrate processes of one `migrate --qemu` / `receive --qemu` migration over
TLS with a PSK (hook_test.py, estimate_test.py)."""
import json
import os
import subprocess
import time

import qemu_harness as h

SKIP = 77
_failed = False


def check(name, ok, detail=""):
    global _failed
    print(f"ok: {name}" if ok else f"FAIL: {name}: {detail}", flush=True)
    _failed |= not ok


def failed():
    return _failed


def passes_clean(passes):
    return bool(passes) and all(x["ram_bad"] == 0 and x["dev_bad"] == 0 for x in passes)


class Cli:
    """The two gpumigrate processes of one migration."""

    def __init__(self, gm, workdir, pair):
        self.gm, self.dir, self.pair = gm, workdir, pair
        self.psk = os.path.join(workdir, "psk")
        with open(self.psk, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        self.port_file = os.path.join(workdir, "port")
        self.receiver = self.source = None

    def start_receiver(self, env=None):
        p = self.pair
        argv = [self.gm, "receive", "--listen", "127.0.0.1:0", "--port-file", self.port_file,
                "--device", f"shm:{p.dst.dev_path}", "--qemu", p.dst.qmp_path, "--qemu-incoming", p.uri,
                "--psk-file", self.psk, "--accept-timeout", "60s", "--resume-window", "3s", "--json"]
        self.rx_out = open(os.path.join(self.dir, "receive.json"), "w+")
        self.rx_err = open(os.path.join(self.dir, "receive.err"), "w+")
        self.receiver = subprocess.Popen(argv, stdout=self.rx_out, stderr=self.rx_err,
                                         env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 20
        while not os.path.exists(self.port_file):
            if self.receiver.poll() is not None or time.monotonic() > deadline:
                raise h.HarnessError(f"receiver did not start: {self.err('rx')}")
            time.sleep(0.02)
        with open(self.port_file) as f:
            return int(f.read())

    def start_source(self, port, extra=()):
        p = self.pair
        argv = [self.gm, "migrate", "--to", f"127.0.0.1:{port}", "--device", f"shm:{p.src.dev_path}",
                "--qemu", p.src.qmp_path, "--psk-file", self.psk, "--warmup", "10ms", "--json", *extra]
        self.tx_out = open(os.path.join(self.dir, "migrate.json"), "w+")
        self.tx_err = open(os.path.join(self.dir, "migrate.err"), "w+")
        self.source = subprocess.Popen(argv, stdout=self.tx_out, stderr=self.tx_err)

    def err(self, side):
        f = self.rx_err if side == "rx" else self.tx_err
        f.seek(0)
        return f.read()[-3000:]

    def report(self, side):
        f = self.rx_out if side == "rx" else self.tx_out
        f.seek(0)
        text = f.read().strip()
        try:
            return json.loads(text.splitlines()[-1]) if text else {}
        except json.JSONDecodeError:
            return {"unparsed": text}

    def wait(self, proc, timeout_s=90):
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return "timeout"

    def close(self):
        for proc in (self.source, self.receiver):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
