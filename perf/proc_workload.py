"""A gpumigrate-workload process for the proc-device benchmarks (projection_check,
scattered_pages, estimator_accuracy): memfd memory written at a set rate (at
random unless a pattern says otherwise), served through its shim in `shim_dir`
($GPUMIGRATE_SHIM_DIR of `env`)."""
import os
import subprocess
import time


def pattern_args(pattern):
    """gpumigrate-workload arguments for a write pattern: random (over all its
    memory), sequential (a sweep), hot=F (random within a fraction F of the
    pages) or burst=ON/OFF (random, writing for ON then pausing for OFF)."""
    if not pattern or pattern == "random":
        return []
    if pattern == "sequential":
        return ["--pattern", "sequential"]
    if pattern.startswith("hot="):
        return ["--pattern", "hot", "--hot", pattern[4:]]
    if pattern.startswith("burst="):
        return ["--burst", pattern[6:]]
    raise ValueError(f"unknown write pattern {pattern}")


def start(wl, env, shim_dir, size, rate, adopt=False, procs=None, extra=(), pattern=""):
    """Starts the workload (a destination's with adopt) and waits for its shim."""
    args = [wl, "--size", size, "--memory", "memfd", "--rate", rate, "--fill", "1"] + pattern_args(pattern)
    if adopt:
        args += ["--adopt", "--run-after", "100ms"] + list(extra)
    p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if procs is not None:
        procs.append(p)
    sock = os.path.join(shim_dir, f"gpumigrate-shim.{p.pid}.sock")
    for _ in range(1200):
        if os.path.exists(sock):
            return p
        if p.poll() is not None:
            raise RuntimeError(f"workload {size} exited {p.returncode} before serving its shim")
        time.sleep(0.05)
    p.kill()
    raise RuntimeError(f"workload {size} never served its shim")


def start_receive(gm, env, work, device, extra, procs=None):
    """Starts `gpumigrate receive` on loopback for `device`; returns (process, port)."""
    port_file = os.path.join(work, "port")
    if os.path.exists(port_file):
        os.unlink(port_file)
    recv = subprocess.Popen([gm, "receive", "--listen", "127.0.0.1:0", "--port-file", port_file, "--device", device,
                             "--json"] + list(extra), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if procs is not None:
        procs.append(recv)
    for _ in range(400):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return recv, open(port_file).read().strip()
        if recv.poll() is not None:
            raise RuntimeError(f"receive exited {recv.returncode} before listening")
        time.sleep(0.05)
    raise RuntimeError("receive never wrote its port")
