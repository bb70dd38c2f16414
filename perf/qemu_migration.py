#!/usr/bin/env python3
"""QEMU's own migration of the same bf16 bytes, for comparison with gpumigrate.

Two qemu-system-x86_64 processes (KVM when /dev/kvm is usable, TCG otherwise),
paused (-S), whose guest RAM is a file: the source's holds the sim's bf16
weights, so QEMU moves the very bytes gpumigrate moves in network_migration.
QEMU migrates over loopback TCP, once in the clear and once with its TLS
(x509 credentials from scripts/make-test-certs). One JSON object per line.

  perf/qemu_migration.py NETWORK_MIGRATION_BINARY [SIZE_MIB]
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

QEMU = shutil.which("qemu-system-x86_64")


class Qmp:
    def __init__(self, path, deadline=20):
        end = time.time() + deadline
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.connect(path)
                break
            except OSError:
                if time.time() > end:
                    raise
                time.sleep(0.05)
        self.f = self.s.makefile("rw")
        json.loads(self.f.readline())  # greeting
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}) + "\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "event" in r:
                continue
            if "error" in r:
                raise RuntimeError(f"{name}: {r['error']}")
            return r["return"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def qemu(ram_file, size_mib, qmp_path, extra):
    accel = "kvm:tcg" if os.access("/dev/kvm", os.R_OK | os.W_OK) else "tcg"
    return subprocess.Popen(
        [QEMU, "-machine", f"pc,accel={accel},memory-backend=m0", "-m", f"{size_mib}M",
         "-object", f"memory-backend-file,id=m0,size={size_mib}M,mem-path={ram_file},share=on",
         "-nodefaults", "-display", "none", "-S", "-qmp", f"unix:{qmp_path},server=on,wait=off"] + extra,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run(tmp, size_mib, src_ram, tls, certs):
    dst_ram = os.path.join(tmp, "dst.ram")
    with open(dst_ram, "wb") as f:
        f.truncate(size_mib << 20)
    port = free_port()
    procs = []
    try:
        creds = lambda ep: ["-object", f"tls-creds-x509,id=tls0,dir={certs},endpoint={ep},verify-peer=on"] if tls else []
        dst = qemu(dst_ram, size_mib, os.path.join(tmp, "dst.qmp"), ["-incoming", "defer"] + creds("server"))
        procs.append(dst)
        src = qemu(src_ram, size_mib, os.path.join(tmp, "src.qmp"), creds("client"))
        procs.append(src)
        dq, sq = Qmp(os.path.join(tmp, "dst.qmp")), Qmp(os.path.join(tmp, "src.qmp"))
        # QEMU caps migration at 128 MiB/s by default: lift the cap, as gpumigrate has none.
        sq.cmd("migrate-set-parameters", **{"max-bandwidth": 100 << 30})
        if tls:
            dq.cmd("migrate-set-parameters", **{"tls-creds": "tls0"})
            sq.cmd("migrate-set-parameters", **{"tls-creds": "tls0", "tls-hostname": "127.0.0.1"})
        dq.cmd("migrate-incoming", uri=f"tcp:127.0.0.1:{port}")
        sq.cmd("migrate", uri=f"tcp:127.0.0.1:{port}")
        deadline = time.time() + 300
        while True:
            st = sq.cmd("query-migrate")
            if st.get("status") in ("completed", "failed", "cancelled"):
                break
            if time.time() > deadline:
                raise RuntimeError("QEMU migration did not finish in 300 s")
            time.sleep(0.05)
        if st["status"] != "completed":
            raise RuntimeError(f"QEMU migration {st['status']}: {st.get('error-desc', '')}")
        ram = st["ram"]
        ms = st["total-time"]
        return {"benchmark": "qemu_migration", "tls": tls, "guest_ram_bytes": size_mib << 20,
                "transferred_bytes": ram["transferred"], "total_ms": ms,
                "bytes_per_s": ram["transferred"] / (ms / 1e3), "downtime_ms": st.get("downtime"),
                "accel": "kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK) else "tcg"}
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main():
    if QEMU is None:
        print(json.dumps({"benchmark": "qemu_migration", "error": "qemu-system-x86_64 is not installed"}))
        return 1
    binary = sys.argv[1]
    size_mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        src_ram = os.path.join(tmp, "src.ram")
        subprocess.run([binary, "--write-bf16", src_ram, "--size", f"{size_mib}MiB"], check=True)
        certs = os.path.join(tmp, "certs")
        subprocess.run([os.path.join(here, "..", "scripts", "make-test-certs"), certs], check=True,
                       stderr=subprocess.DEVNULL)
        # QEMU's x509 directory layout.
        for ours, theirs in [("ca.pem", "ca-cert.pem"), ("dest.pem", "server-cert.pem"), ("dest.key", "server-key.pem"),
                             ("source.pem", "client-cert.pem"), ("source.key", "client-key.pem")]:
            os.symlink(os.path.join(certs, ours), os.path.join(certs, theirs))
        for tls in (False, True):
            print(json.dumps(run(tmp, size_mib, src_ram, tls, certs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
