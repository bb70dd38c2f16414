#!/usr/bin/env python3
"""Checkpoint benchmark: what `gpumigrate checkpoint` and `restore` achieve on
this machine's disk, beside the disk's own sequential write and read speed
measured in the same run with dd (the floor), through the CLI a user runs.

  perf/checkpoint.py path/to/gpumigrate [SIZE_MiB] [DIR]

Prints one JSON object per line: the dd floors, then for a sim device of SIZE
(default 1024 MiB, bf16 weights as the sim makes them): stop-and-copy and live
checkpoints (plain, encrypted, zstd), each with its file size, write throughput
(device bytes / checkpoint wall time) and its ratio to the dd write floor, its
stun; and the restore of each (verify pass + restore pass) with its throughput
and ratio to the dd read floor."""
import json
import os
import subprocess
import sys
import tempfile
import time

gm = sys.argv[1]
size_mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
base = sys.argv[3] if len(sys.argv) > 3 else None
work = tempfile.mkdtemp(prefix="gm-ckpt-perf-", dir=base)
dev = f"sim:size={size_mib}MiB"
env = dict(os.environ, GPUMIGRATE_CALIBRATION=os.path.join(work, "cal.json"))


def drop_caches():
    # Reads must come from the disk, not the page cache, for the read floor and restores to compare.
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd(args):
    t = time.monotonic()
    subprocess.run(["dd", *args, "status=none"], check=True)
    return time.monotonic() - t


def run(cmd):
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1]), wall


floor_file = os.path.join(work, "dd.bin")
nbytes = size_mib << 20
w = dd(["if=/dev/urandom", f"of={floor_file}.src", "bs=4M", f"count={size_mib // 4}"])  # incompressible source
t_write = dd([f"if={floor_file}.src", f"of={floor_file}", "bs=4M", "conv=fdatasync"])
cold = drop_caches()
t_read = dd([f"if={floor_file}", "of=/dev/null", "bs=4M"])
os.unlink(floor_file)
os.unlink(floor_file + ".src")
floor = {"bench": "checkpoint_floor", "bytes": nbytes, "dd_write_bytes_per_s": round(nbytes / t_write),
         "dd_read_bytes_per_s": round(nbytes / t_read), "cold_cache_reads": cold}
print(json.dumps(floor), flush=True)

key = os.path.join(work, "k")
with open(key, "wb") as f:
    f.write(os.urandom(32))
cases = [
    ("stop_first", ["--stop-first"]),
    ("live", []),
    ("live_encrypted", ["--key-file", key]),
    ("live_zstd", ["--codec", "zstd:1"]),
    ("stop_first_encrypted", ["--stop-first", "--key-file", key]),
]
for name, extra in cases:
    path = os.path.join(work, f"{name}.ckpt")
    r, wall = run([gm, "checkpoint", "--device", dev, "--to", path, "--warmup", "300ms", "--json", *extra])
    file_bytes = r["checkpoint"]["file_bytes"]
    write_bps = nbytes / (r["total_ms"] / 1e3)
    out = {"bench": "checkpoint_write", "case": name, "device_bytes": nbytes, "file_bytes": file_bytes,
           "rounds": len(r["rounds"]), "total_ms": r["total_ms"], "stun_ms": r["stun_ms"],
           "stun_breakdown_ms": r["stun_breakdown_ms"], "device_bytes_per_s": round(write_bps),
           "file_bytes_per_s": round(file_bytes / (r["total_ms"] / 1e3)),
           "ratio_file_rate_to_dd_write": round(file_bytes / (r["total_ms"] / 1e3) / floor["dd_write_bytes_per_s"], 3)}
    print(json.dumps(out), flush=True)
    drop_caches()
    key_args = ["--key-file", key] if "--key-file" in extra else []
    rr, rwall = run([gm, "restore", "--from", path, "--device", dev, "--run-after", "0s", "--json", *key_args])
    read_bps = file_bytes * 2 / (rr["total_ms"] / 1e3)  # verify pass + restore pass each read the file
    print(json.dumps({"bench": "checkpoint_restore", "case": name, "file_bytes": file_bytes,
                      "outcome": rr["outcome"], "verified": rr["verified"], "wall_ms": round(rwall * 1e3, 1),
                      "restore_pass_ms": rr["total_ms"],
                      "file_read_bytes_per_s_restore_pass": round(file_bytes / (rr["total_ms"] / 1e3)),
                      "ratio_restore_pass_to_dd_read": round(file_bytes / (rr["total_ms"] / 1e3) / floor["dd_read_bytes_per_s"], 3)}),
          flush=True)
    os.unlink(path)
subprocess.run(["rm", "-rf", work])
