#!/usr/bin/env python3
"""The data path's throughput beside its floors (issue 38, step 1: the baseline
the parallel pipeline will be judged by), through what a user runs: `migrate`
and `receive` as two processes on loopback, `checkpoint` and `restore` for each
side alone.

  perf/pipeline.py GPUMIGRATE NETWORK_MIGRATION [SIZES] [STREAMS] [RUNS] [THREADS]

SIZES: comma-separated sim sizes (default 1GiB,4GiB); STREAMS: data streams
(default 2); RUNS: repetitions of each line (default 1; the median is printed);
THREADS: comma-separated source worker counts (`--threads`, default 1,2): each
source line once per count.
NETWORK_MIGRATION: build/release/perf/network_migration (its --floors-only).

Printed, one JSON object per line, all measured in this run:
  host_profile   `gpumigrate calibrate`'s per-core rate of each stage (copy, page
                 hash, AES-256-GCM, one side of loopback TCP, each codec; the
                 codecs measured on bf16 weights) and the sim's own read rate;
  floor          raw loopback TCP, and the encrypted floor: the same streams
                 carrying the same bytes in 1 MiB frames sealed with AES-256-GCM
                 by the sender and opened by the receiver, no session;
  source_alone   `checkpoint` into a file on tmpfs (the source pipeline with a
                 recorder that appends frames as its sink);
  dest_alone     `restore` from that file (the destination pipeline fed a
                 recorded stream);
  end_to_end     `migrate` -> `receive` over loopback: plain (integrity tag,
                 no TLS), tls (PSK TLS 1.3 control, AES-256-GCM frames),
                 tls+zstd, tls+bf16, and tls with --codec auto behind a
                 1 GB/s cap (its raw rate beside the cap: the codec beats the
                 link when above 1); on bf16 weights and on noise;
each with its raw rate (device bytes before compression per second of round 0,
the round that moves the device), its CPU floor and the ratio to it, and both
processes' peak RSS. The CPU floor of a configuration is this host's cores
divided by the per-core time every stage a byte passes costs, on both sides
(source: sim read, page hash, codec, seal, TCP send; destination: TCP receive,
open, codec, page hash, write): what the engine could move if every stage ran
on every core with nothing else in the way. TCP's cost per side is the raw
floor's CPU time per byte, halved (`tcp_side`), measured in the same run. Seal, open and TCP cost per wire
byte (raw / the run's compression ratio). The codecs' rates are measured on bf16
weights: on noise a codec gives up sooner, so its floor there is low (a ratio
above 1). `workers` is the source's --threads on source and end-to-end lines,
restore's --threads on dest_alone lines (the destination's workers: threads that
open and write frames beside each stream's receiving thread; 0: each stream's
thread does it all); `destination_workers` on end-to-end lines is what receive
ran by default (the cores the streams leave)."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

if len(sys.argv) < 3:
    sys.exit(__doc__[__doc__.index("  perf/pipeline.py"):__doc__.index("SIZES:")].strip())
gm, floors_bin = sys.argv[1], sys.argv[2]
sizes = (sys.argv[3] if len(sys.argv) > 3 else "1GiB,4GiB").split(",")
streams = int(sys.argv[4]) if len(sys.argv) > 4 else 2
runs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
threads = [int(t) for t in (sys.argv[6] if len(sys.argv) > 6 else "1,2").split(",")]
work = tempfile.mkdtemp(prefix="gm-pipeline-perf-")
shm = tempfile.mkdtemp(prefix="gm-pipeline-perf-", dir="/dev/shm") if os.path.isdir("/dev/shm") else work
env = dict(os.environ, GPUMIGRATE_CALIBRATION=os.path.join(work, "cal.json"))
psk = os.path.join(work, "psk")
with open(psk, "w") as f:
    f.write(os.urandom(32).hex() + "\n")
cores = os.cpu_count() or 1

CONFIGS = {  # name: (migrate/receive security args, codec, seal stage)
    "plain": (["--insecure-no-tls"], "none", "hash"),
    "tls": (["--psk-file", psk], "none", "aes_gcm"),
    "tls+zstd": (["--psk-file", psk], "zstd", "aes_gcm"),
    "tls+bf16": (["--psk-file", psk], "bf16", "aes_gcm"),
    # Issue 38's codec goal: behind a 1 GB/s link, `--codec auto` must move
    # bf16 weights faster than the link (raw rate >= 1.35 GB/s).
    "tls+auto@1GB/s": (["--psk-file", psk], "auto", "aes_gcm"),
}
LINK_CAPS = {"tls+auto@1GB/s": 1e9}  # migrate --bandwidth (bytes/s on the wire)


def emit(obj):
    print(json.dumps(obj), flush=True)


def device(size, data):
    # Almost all of it moves in round 0: weights and a full KV cache, no free pool
    # of zero pages to elide, a 64 KiB hot set, no KV appends.
    return f"sim:size={size},static=0.98,kv=0.01,kv_fill=1,kv_rate=0,hot=64KiB" + (",data=noise" if data == "noise" else "")


def run(cmd, timeout=900):
    """Runs cmd; returns (rc, stdout, peak RSS in bytes, CPU seconds)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        pid, status, ru = wait4(p, timeout)
        out.seek(0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode()[-2000:], ru


def wait4(p, timeout):
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return pid, status, {"peak_rss_bytes": ru.ru_maxrss * 1024, "cpu_s": round(ru.ru_utime + ru.ru_stime, 3)}
        if time.monotonic() > deadline:
            p.kill()
        time.sleep(0.02)


def host_profile():
    path = os.path.join(work, "host.json")
    rc, out, err, _ = run([gm, "calibrate", "--profile-out", path, "--json"])
    if rc != 0:
        sys.exit(f"calibrate failed: {err}")
    per_core = json.load(open(path))["per_core_bytes_per_s"]
    rc, out, err, _ = run([floors_bin, "--size", "1GiB", "--streams", str(streams), "--floors-only", "1"])
    if rc != 0:
        sys.exit(f"{floors_bin} --floors-only failed: {err}")
    floors = {}
    for line in out.splitlines():
        j = json.loads(line)
        if j["benchmark"] == "sim_read":
            per_core[f"sim_read_{j['data']}"] = j["per_core_bytes_per_s"]
        else:
            floors[j["benchmark"]] = j
    # One side's cost of loopback TCP as the raw floor measured it in this run
    # (its CPU seconds per GB carried, both sides together, halved), not
    # calibrate's `tcp` stage, which runs both ends of its socket on one core
    # and costs about twice that here: with it, lines ran above their "floor".
    per_core["tcp_side"] = 2e9 / floors["raw_loopback_tcp"]["cpu_s_per_gb"]
    emit({"kind": "host_profile", "cores": cores, "per_core_bytes_per_s": {k: round(v) for k, v in per_core.items()}})
    for name, j in floors.items():
        emit({"kind": "floor", "name": name, "streams": streams, "bytes_per_s": round(j["bytes_per_s"]),
              "cpu_s_per_gb": round(j["cpu_s_per_gb"], 3)})
    return per_core, floors


def cpu_floor(per_core, data, config, ratio, side="both"):
    """Bytes/s (raw) if every stage a byte passes ran on every core (per-core costs summed).
    side "source": into a file on tmpfs (the recorder's append costs a copy, no TCP);
    "destination": from such a file (reading it costs a copy, no TCP)."""
    _, codec, seal = CONFIGS[config]
    ratio = max(ratio, 1e-9)
    c = {k: 1 / v for k, v in per_core.items()}  # seconds per byte on one core
    src = c[f"sim_read_{data}"] + c["hash"] + (c[f"{codec}_compress"] if codec != "none" else 0) + c[seal] / ratio
    dst = c[seal] / ratio + (c[f"{codec}_decompress"] if codec != "none" else 0) + c["hash"] + c["copy"]
    if side == "source":
        return cores / (src + c["copy"] / ratio)
    if side == "destination":
        return cores / (dst + c["copy"] / ratio)
    return cores / (src + dst + 2 * c["tcp_side"] / ratio)


def end_to_end(size, data, config, workers):
    sec, codec, _ = CONFIGS[config]
    dev = device(size, data)
    port_file = os.path.join(work, "port")
    if os.path.exists(port_file):
        os.unlink(port_file)
    recv_out = tempfile.TemporaryFile()
    recv = subprocess.Popen([gm, "receive", "--listen", "127.0.0.1:0", "--port-file", port_file, "--device", dev,
                             "--json", "--run-after", "50ms"] + sec, env=env, stdout=recv_out,
                            stderr=subprocess.DEVNULL)
    for _ in range(600):
        if os.path.exists(port_file) and open(port_file).read().strip():
            break
        time.sleep(0.05)
    port = open(port_file).read().strip()
    rc, out, err, src_ru = run([gm, "migrate", "--device", dev, "--to", f"127.0.0.1:{port}", "--streams", str(streams),
                                "--codec", codec, "--threads", str(workers), "--warmup", "100ms", "--json"] + sec +
                               (["--bandwidth", f"{LINK_CAPS[config] / 1e9:g}GB/s"] if config in LINK_CAPS else []))
    _, _, dst_ru = wait4(recv, 300)
    recv_out.seek(0)
    rout = recv_out.read().decode()
    if rc != 0 or recv.returncode != 0:
        sys.exit(f"{config} {data} {size}: migration failed ({rc}/{recv.returncode}): {out[-1500:]} {err}")
    s = json.loads(out)
    r0 = s["rounds"][0]
    return {"destination_workers": json.loads(rout).get("destination_workers"), "raw_bytes_per_s": r0["raw_bytes"] / (r0["ms"] / 1e3), "wire_bytes_per_s": r0["bytes"] / (r0["ms"] / 1e3),
            "ratio": s["compression_ratio"], "round0_ms": r0["ms"], "stun_ms": s["stun_ms"],
            "codecs": sorted({c["codec"] for c in s.get("codecs", [])}),
            "source": src_ru, "destination": dst_ru, "verified": s["verified"] and json.loads(rout)["verified"]}


def one_side(size, data, workers):
    """The source alone (checkpoint --threads W) once, then the destination alone
    (restore --threads D) from its file for every D in THREADS and 0."""
    dev = device(size, data)
    path = os.path.join(shm, "ckpt")
    rc, out, err, src_ru = run([gm, "checkpoint", "--device", dev, "--to", path, "--threads", str(workers),
                                "--warmup", "100ms", "--json"])
    if rc != 0:
        sys.exit(f"checkpoint {dev}: {err}")
    c = json.loads(out)
    r0 = c["rounds"][0]
    dst = {}
    for d_workers in sorted(set([0] + threads)):
        rc, out, err, dst_ru = run([gm, "restore", "--from", path, "--device", dev, "--run-after", "50ms",
                                    "--threads", str(d_workers), "--json"])
        if rc != 0:
            sys.exit(f"restore {dev}: {err}")
        d = json.loads(out)
        dst[d_workers] = {"raw_bytes_per_s": d["bytes_sent"] / (d["total_ms"] / 1e3), "rss": dst_ru}
    os.unlink(path)
    return {"raw_bytes_per_s": r0["raw_bytes"] / (r0["ms"] / 1e3), "rss": src_ru}, dst


def median_of(results, key):
    return statistics.median(r[key] for r in results)


per_core, floors = host_profile()
raw_tcp = floors["raw_loopback_tcp"]["bytes_per_s"]
enc_tcp = floors["encrypted_loopback_tcp"]["bytes_per_s"]
for size in sizes:
    for data in ("bf16", "noise"):
        for workers in threads:
            sides = [one_side(size, data, workers) for _ in range(runs)]
            lines = [("source_alone", "source", workers, [s[0] for s in sides])]
            if workers == threads[0]:  # the destination's lines once, from the first count's files
                lines += [("dest_alone", "destination", d, [s[1][d] for s in sides]) for d in sorted(sides[0][1])]
            for kind, side, w, got in lines:
                rate = statistics.median(g["raw_bytes_per_s"] for g in got)
                floor = cpu_floor(per_core, data, "plain", 1.0, side)
                emit({"kind": kind, "size": size, "data": data, "security": "integrity tag (no --key-file)",
                      "workers": w, "raw_bytes_per_s": round(rate),
                      "cpu_floor_bytes_per_s": round(floor), "of_cpu_floor": round(rate / floor, 3),
                      "peak_rss_bytes": max(g["rss"]["peak_rss_bytes"] for g in got)})
        for config in CONFIGS:
            for workers in threads:
                res = [end_to_end(size, data, config, workers) for _ in range(runs)]
                rate = median_of(res, "raw_bytes_per_s")
                ratio = median_of(res, "ratio")
                if config in LINK_CAPS:  # bound by the cap, not the CPU: its figure is the ratio to the cap
                    cap = LINK_CAPS[config]
                    emit({"kind": "end_to_end", "size": size, "data": data, "config": config, "streams": streams,
                          "workers": workers, "raw_bytes_per_s": round(rate), "link_cap_bytes_per_s": round(cap),
                          "of_link_cap": round(rate / cap, 3), "compression_ratio": round(ratio, 3),
                          "codecs": res[0]["codecs"],
                          "source_peak_rss_bytes": max(r["source"]["peak_rss_bytes"] for r in res),
                          "destination_peak_rss_bytes": max(r["destination"]["peak_rss_bytes"] for r in res),
                          "round0_ms": round(median_of(res, "round0_ms"), 1),
                          "verified": all(r["verified"] for r in res)})
                    continue
                floor = cpu_floor(per_core, data, config, ratio)
                emit({"kind": "end_to_end", "size": size, "data": data, "config": config, "streams": streams,
                      "workers": workers, "destination_workers": res[0]["destination_workers"],
                      "raw_bytes_per_s": round(rate),
                      "wire_bytes_per_s": round(median_of(res, "wire_bytes_per_s")),
                      "compression_ratio": round(ratio, 3), "cpu_floor_bytes_per_s": round(floor),
                      "of_cpu_floor": round(rate / floor, 3),
                      "of_raw_tcp": round(rate / raw_tcp, 3), "of_encrypted_floor": round(rate / enc_tcp, 3),
                      "source_peak_rss_bytes": max(r["source"]["peak_rss_bytes"] for r in res),
                      "destination_peak_rss_bytes": max(r["destination"]["peak_rss_bytes"] for r in res),
                      "source_cpu_s": median_of([r["source"] for r in res], "cpu_s"),
                      "destination_cpu_s": median_of([r["destination"] for r in res], "cpu_s"),
                      "round0_ms": round(median_of(res, "round0_ms"), 1), "verified": all(r["verified"] for r in res)})
