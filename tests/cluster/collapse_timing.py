#!/usr/bin/env python3
"""How long a migration goes on after its link collapses: two hosts of the
namespace harness (cluster.py) at 200 Mbit, `receive` in gpu-b, `migrate` of a
sim (hot set 4 MiB) from gpu-a with --max-stun 2s, gpu-a's link cut to 2 Mbit
with tc 1.2 s in; prints the source's progress lines with their times and when
`migrate` exited, counted from the cut (docs/reliability.md, "A link too slow for the
workload"). A measurement, not a test: it checks nothing.

Usage: collapse_timing.py GPUMIGRATE [DEVICE [MIGRATE-ARGS...]] (root)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402


def main(argv):
    if len(argv) < 2:
        print(__doc__[__doc__.index("Usage:"):].strip(), file=sys.stderr)
        return 2
    why = cluster.available()
    if why:
        print(f"collapse_timing: cannot run: {why}", file=sys.stderr)
        return 77
    gm = os.path.abspath(argv[1])
    dev = argv[2] if len(argv) > 2 else "sim:size=64MiB,static=0.9,hot=4MiB,page=64KiB"
    extra = argv[3:]
    work = tempfile.mkdtemp(prefix="gm-collapse-")
    try:
        with cluster.Cluster(["gpu-a", "gpu-b"], rate="200mbit") as c:
            psk = os.path.join(work, "psk")
            with open(psk, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
            env = dict(os.environ, GPUMIGRATE_CALIBRATION=os.path.join(work, "calibration.json"))
            pf = os.path.join(work, "port")
            rx = c.popen("gpu-b", [gm, "receive", "--listen", f"{c.addr('gpu-b')}:0", "--port-file", pf,
                                   "--device", dev, "--psk-file", psk, "--json", "--accept-timeout", "60s"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            deadline = time.monotonic() + 30
            while not (os.path.exists(pf) and os.path.getsize(pf) > 0):
                if time.monotonic() > deadline or rx.poll() is not None:
                    print("collapse_timing: the receiver did not listen", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            port = open(pf).read().strip()
            t0 = time.monotonic()
            m = c.popen("gpu-a", [gm, "migrate", "--device", dev, "--to", f"{c.addr('gpu-b')}:{port}", "--psk-file",
                                  psk, "--json", "--max-stun", "2s", *extra],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            lines = []
            reader = threading.Thread(target=lambda: [lines.append((time.monotonic() - t0, x.rstrip()))
                                                      for x in m.stderr], daemon=True)
            reader.start()
            time.sleep(1.2)
            c.set_rate("gpu-a", "2mbit")
            cut = time.monotonic() - t0
            try:
                m.wait(timeout=600)
            except subprocess.TimeoutExpired:
                m.kill()
                m.wait()
            end = time.monotonic() - t0
            reader.join(5)
            for t, line in lines:
                print(f"{t:7.2f} s  {line[:300]}")
            print(f"cut at {cut:.2f} s; migrate exited {m.returncode} at {end:.2f} s, {end - cut:.2f} s after the cut")
            rx.kill()
            return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
