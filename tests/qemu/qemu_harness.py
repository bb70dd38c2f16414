#!/usr/bin/env python3
"""A source and a destination QEMU around the test guest (tests/qemu/guest), for
end-to-end migration tests and benchmarks. Python 3 standard library only.

Memory layout (docs/qemu-facts.md §3.3, workaround B): main RAM is NUMA node 0, a
private memory-backend-ram of R MiB; the "device memory" is node 1, a
memory-backend-file share=on of D MiB under /dev/shm, so it starts at
GPA = R MiB. With the `x-ignore-shared` capability on both sides QEMU leaves
node 1 out of its stream; whoever migrates the device memory (the test's copy,
later the gpumigrate engine) writes the destination's file in place.

Command lines (accel kvm when /dev/kvm opens read-write and a KVM guest really
runs, else tcg; GM_QEMU_ACCEL=kvm|tcg overrides):

  qemu-system-x86_64 -machine pc,accel=ACCEL -m R+D M -nodefaults -display none -no-reboot \
    -object memory-backend-ram,id=ram0,size=RM \
    -object memory-backend-file,id=dev0,share=on,mem-path=/dev/shm/gm-TAG-src,size=DM \
    -numa node,nodeid=0,memdev=ram0 -numa node,nodeid=1,memdev=dev0 \
    -kernel guest.elf -append "ram_mb=G dev_mb=D dev_base=0x... period=P every=E" \
    -debugcon file:DIR/src.con -qmp unix:DIR/src.qmp,server=on,wait=off
  destination: the same with its own files (DIR/dst.*, /dev/shm/gm-TAG-dst) plus
    -incoming defer -S
  The migration URI is unix:DIR/mig.sock (Pair.uri).

Guest console (port 0xE9): "GUEST-START ...", then "pass N ram_bad=X dev_bad=Y ticks=T".
The destination console has no GUEST-START: the guest continues, it does not boot.

Python API (import this file; see baseline_test.py):
  accel = probe_accel(guest_elf)                      # "kvm" or "tcg"
  with Pair(workdir, guest_elf, ram_mb=64, dev_mb=32, guest_ram_mb=32,
            period=10, every=1, accel=None, max_life_s=300) as p:
      p.start()                                       # both QEMUs; dst waits in -incoming defer -S
      p.src.qmp.execute("query-status")               # Qmp: execute(cmd, args=None, timeout_s=10)
      p.src.qmp.wait_event("MIGRATION", lambda d: d["status"] == "pre-switchover", timeout_s=30)
      p.set_migration_caps()                          # events, return-path, x-ignore-shared (+ pause-before-switchover on src)
      p.src.wait_pass(3, timeout_s=20)                # -> {"pass": n, "ram_bad": x, "dev_bad": y, "ticks": t}
      p.src.passes()                                  # every pass line so far, as such dicts
      copy_device(p.src.dev_path, p.dst.dev_path)     # in place, never truncating the mapped file
      p.src.disconnect()                              # before another QMP client (gpumigrate) connects
      p.cmdline("src"), p.describe()                  # argv; everything as the CLI's pair.json
  install_cleanup_on_signals()                        # SIGTERM/SIGHUP/SIGINT unwind the with-block
  Qmp(socket_path) alone: execute(), wait_event(name, pred, timeout_s), events (queued), close()
  # leaving the block (or an exception, SIGTERM, exit) kills both QEMUs and removes
  # their /dev/shm files and sockets.

CLI (for shell tests that hand the QEMUs to another program):
  qemu_harness.py start-pair --dir D --guest guest.elf [--ram-mb 64 --dev-mb 32 --guest-ram-mb 32
                  --period 10 --every 1 --accel auto|kvm|tcg --max-life 300]
      starts both, prints one JSON object (also kept in D/pair.json): pids, qmp sockets, consoles,
      device files, uri, accel. A detached reaper stops the pair after --max-life seconds.
  qemu_harness.py qmp --dir D --side src|dst CMD [JSON-ARGS]   prints the return value as JSON
  qemu_harness.py wait-pass --dir D --side src|dst --pass N [--timeout 30]
      waits for a pass line numbered >= N; prints it as JSON (exit 1 on timeout or guest fault)
  qemu_harness.py wait-migration --dir D --side src|dst --status S [--timeout 30]
      polls query-migrate until status S (exit 1 when it times out or becomes failed/cancelled)
  qemu_harness.py copy-device --dir D     copies the source's device file into the destination's in place
  qemu_harness.py stop --dir D            kills both QEMUs and the reaper, removes shm files and sockets
QMP allows one client at a time: the CLI connects per command, so events are not
seen across commands (poll with wait-migration); hold a connection (API) for events.
"""

import argparse
import ctypes
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

QEMU = os.environ.get("GM_QEMU", "qemu-system-x86_64")
PASS_RE = re.compile(r"^pass (\d+) ram_bad=(\d+) dev_bad=(\d+) ticks=(\d+)$")
MIB = 1 << 20


class HarnessError(Exception):
    pass


class QmpError(HarnessError):
    def __init__(self, cmd, error):
        super().__init__(f"qmp: {cmd} failed: {error.get('class')}: {error.get('desc')}")
        self.error = error


class Qmp:
    """One QMP connection: greeting, qmp_capabilities, commands; events are queued."""

    def __init__(self, path, timeout_s=10):
        self.path = path
        self.events = []
        self._buf = b""
        deadline = time.monotonic() + timeout_s
        while True:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self._sock.close()
                if time.monotonic() > deadline:
                    raise HarnessError(f"qmp: connect {path} failed: no listener after {timeout_s} s")
                time.sleep(0.05)
        greeting = self._read(deadline)
        if "QMP" not in greeting:
            raise HarnessError(f"qmp: {path}: unexpected greeting {greeting}")
        self.version = greeting["QMP"]["version"]["qemu"]
        self.execute("qmp_capabilities")

    def _read(self, deadline):
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HarnessError(f"qmp: {self.path}: no reply in time")
            ready, _, _ = select.select([self._sock], [], [], left)
            if ready:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise HarnessError(f"qmp: {self.path}: QEMU closed the connection")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, cmd, args=None, timeout_s=10):
        msg = {"execute": cmd}
        if args:
            msg["arguments"] = args
        self._sock.sendall(json.dumps(msg).encode() + b"\n")
        deadline = time.monotonic() + timeout_s
        while True:
            r = self._read(deadline)
            if "event" in r:
                self.events.append(r)
            elif "error" in r:
                raise QmpError(cmd, r["error"])
            elif "return" in r:
                return r["return"]

    def wait_event(self, name, pred=None, timeout_s=30):
        """The first queued or arriving event NAME whose data satisfies pred; removed from the queue."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, e in enumerate(self.events):
                if e["event"] == name and (pred is None or pred(e.get("data", {}))):
                    return self.events.pop(i)
            try:
                r = self._read(deadline)
            except HarnessError as e:
                raise HarnessError(f"qmp: waiting for {name} on {self.path}: {e}") from None
            if "event" in r:
                self.events.append(r)

    def close(self):
        try:
            self._sock.close()
        except OSError:
            pass


def _kvm_opens():
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
        return True
    except OSError:
        return False


def probe_accel(guest_elf, timeout_s=8):
    """kvm when /dev/kvm opens read-write and the guest reaches pass 2 under KVM
    within timeout_s, else tcg. Opening is not enough: on a nested host here KVM
    opened, then SeaBIOS took >10 s and the guest hung in its first iret. The
    answer is cached per boot in /tmp; GM_QEMU_ACCEL=kvm|tcg overrides."""
    forced = os.environ.get("GM_QEMU_ACCEL", "auto")
    if forced in ("kvm", "tcg"):
        return forced
    if not _kvm_opens():
        return "tcg"
    try:
        boot_id = open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        boot_id = "unknown"
    cache = f"/tmp/gm-qemu-accel.{boot_id}"
    try:
        cached = open(cache).read().strip()
        if cached in ("kvm", "tcg"):
            return cached
    except OSError:
        pass
    con = f"/tmp/gm-qemu-accel-probe.{os.getpid()}.con"
    proc = subprocess.Popen([QEMU, "-machine", "pc,accel=kvm", "-m", "32M", "-nodefaults", "-display", "none",
                             "-no-reboot", "-kernel", guest_elf, "-append", "ram_mb=1 period=1",
                             "-debugcon", f"file:{con}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    answer = "tcg"
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(con) and "pass 2 " in open(con, errors="replace").read():
                answer = "kvm"
                break
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
        _unlink(con)
    try:
        with open(cache, "w") as f:
            f.write(answer + "\n")
    except OSError:
        pass
    return answer


def copy_device(src_path, dst_path, chunk_bytes=4 * MIB):
    """Copies src into dst in place. dst is mapped by the destination QEMU:
    truncating it (cp, open "wb") would pull the pages from under the guest."""
    with open(src_path, "rb") as s, open(dst_path, "r+b") as d:
        while True:
            b = s.read(chunk_bytes)
            if not b:
                break
            d.write(b)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _die_with_parent():
    """preexec: the QEMU gets SIGKILL when the harness dies, even by SIGKILL (ctest timeout)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pid_alive(pid):
    """Running or stopped; a zombie (exited, not yet reaped by whoever adopted it) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _kill_pid(pid, timeout_s=5):
    """SIGTERM, then SIGKILL; waits for it to go (reaps it when it is our child)."""
    if not pid or not _pid_alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            if not _pid_alive(pid):
                return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


class Guest:
    """One QEMU running the test guest: its files, its process, a lazy QMP connection."""

    def __init__(self, role, workdir, tag):
        self.role = role
        self.console = os.path.join(workdir, f"{role}.con")
        self.qmp_path = os.path.join(workdir, f"{role}.qmp")
        self.log = os.path.join(workdir, f"{role}.log")
        self.dev_path = f"/dev/shm/gm-{tag}-{role}"
        self.proc = None
        self.pid = None
        self._qmp = None

    @property
    def qmp(self):
        if self._qmp is None:
            self._qmp = Qmp(self.qmp_path)
        return self._qmp

    def disconnect(self):
        """Drops this harness's QMP connection: QEMU serves one QMP client at a
        time, so do this before another program (the gpumigrate CLI) connects."""
        if self._qmp:
            self._qmp.close()
            self._qmp = None

    def console_text(self):
        try:
            with open(self.console, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def passes(self):
        out = []
        for line in self.console_text().splitlines():
            m = PASS_RE.match(line)
            if m:
                n, r, d, t = map(int, m.groups())
                out.append({"pass": n, "ram_bad": r, "dev_bad": d, "ticks": t})
        return out

    def alive(self):
        if self.proc is not None:
            return self.proc.poll() is None
        return bool(self.pid) and _pid_alive(self.pid)

    def wait_pass(self, min_pass, timeout_s=30):
        """The first pass line numbered >= min_pass; raises on timeout, a guest fault or a dead QEMU."""
        deadline = time.monotonic() + timeout_s
        while True:
            for p in self.passes():
                if p["pass"] >= min_pass:
                    return p
            text = self.console_text()
            if "GUEST-FAULT" in text or "GUEST-ERROR" in text:
                raise HarnessError(f"{self.role} guest stopped: {text.strip().splitlines()[-1]}")
            if not self.alive():
                raise HarnessError(f"{self.role} QEMU exited; log: {self.log_tail()}")
            if time.monotonic() > deadline:
                last = self.passes()[-1:] or "no pass yet"
                raise HarnessError(f"{self.role}: no pass >= {min_pass} in {timeout_s} s (last: {last})")
            time.sleep(0.05)

    def log_tail(self, lines=5):
        try:
            with open(self.log, errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def close(self):
        self.disconnect()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        elif self.pid:
            _kill_pid(self.pid)
        for path in (self.dev_path, self.qmp_path):
            _unlink(path)


_live_pairs = []


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def install_cleanup_on_signals():
    """SIGTERM/SIGHUP/SIGINT unwind through the with-blocks (and atexit) so QEMUs and files go."""
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, _on_sigterm)


def _close_all():
    for p in list(_live_pairs):
        p.close()


import atexit  # noqa: E402  (registered once, after the classes it needs)
atexit.register(_close_all)


class Pair:
    """A source QEMU running the guest and a destination waiting in -incoming defer -S."""

    def __init__(self, workdir, guest_elf, ram_mb=64, dev_mb=32, guest_ram_mb=32, period=10, every=1,
                 accel=None, tag=None):
        if guest_ram_mb + 16 > ram_mb:
            raise HarnessError(f"guest_ram_mb {guest_ram_mb} + 16 MiB does not fit node 0 of {ram_mb} MiB")
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.guest_elf = os.path.abspath(guest_elf)
        self.ram_mb, self.dev_mb, self.guest_ram_mb = ram_mb, dev_mb, guest_ram_mb
        self.period, self.every = period, every
        self.accel = accel or probe_accel(self.guest_elf)
        self.tag = tag or f"{os.getpid()}-{int(time.time() * 1000) % 1000000}"
        self.uri = f"unix:{self.workdir}/mig.sock"
        self.src = Guest("src", self.workdir, self.tag)
        self.dst = Guest("dst", self.workdir, self.tag)

    def cmdline(self, role):
        g = self.src if role == "src" else self.dst
        append = (f"ram_mb={self.guest_ram_mb} dev_mb={self.dev_mb} dev_base={self.ram_mb * MIB:#x} "
                  f"period={self.period} every={self.every}")
        argv = [QEMU, "-machine", f"pc,accel={self.accel}", "-m", f"{self.ram_mb + self.dev_mb}M",
                "-nodefaults", "-display", "none", "-no-reboot",
                "-object", f"memory-backend-ram,id=ram0,size={self.ram_mb}M",
                "-object", f"memory-backend-file,id=dev0,share=on,mem-path={g.dev_path},size={self.dev_mb}M",
                "-numa", "node,nodeid=0,memdev=ram0", "-numa", "node,nodeid=1,memdev=dev0",
                "-kernel", self.guest_elf, "-append", append,
                "-debugcon", f"file:{g.console}", "-qmp", f"unix:{g.qmp_path},server=on,wait=off"]
        if role == "dst":
            argv += ["-incoming", "defer", "-S"]
        return argv

    def start(self, die_with_parent=True, timeout_s=10):
        _live_pairs.append(self)
        for g in (self.src, self.dst):
            for path in (g.console, g.qmp_path, g.dev_path):
                _unlink(path)
            with open(g.log, "w") as log:
                g.proc = subprocess.Popen(self.cmdline(g.role), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          preexec_fn=_die_with_parent if die_with_parent else None,
                                          start_new_session=not die_with_parent)
            g.pid = g.proc.pid
        deadline = time.monotonic() + timeout_s
        for g in (self.src, self.dst):
            while not os.path.exists(g.qmp_path):
                if g.proc.poll() is not None:
                    raise HarnessError(f"{g.role} QEMU exited with {g.proc.returncode}: {g.log_tail()}")
                if time.monotonic() > deadline:
                    raise HarnessError(f"{g.role} QEMU: no QMP socket after {timeout_s} s")
                time.sleep(0.02)
        return self

    def set_migration_caps(self, extra_src=(), extra_dst=(), max_bandwidth_bytes_per_s=1 << 30):
        """events, return-path and x-ignore-shared on both (docs/qemu-facts.md §0 items 2, 5); the source also
        pauses before switchover. Also raises the source's bandwidth cap from QEMU's default 128 MiB/s."""
        common = ["events", "return-path", "x-ignore-shared"]
        for g, caps in ((self.src, common + ["pause-before-switchover"] + list(extra_src)),
                        (self.dst, common + list(extra_dst))):
            g.qmp.execute("migrate-set-capabilities",
                          {"capabilities": [{"capability": c, "state": True} for c in caps]})
        self.src.qmp.execute("migrate-set-parameters", {"max-bandwidth": max_bandwidth_bytes_per_s})

    def describe(self):
        return {"accel": self.accel, "uri": self.uri, "workdir": self.workdir, "tag": self.tag,
                "ram_mb": self.ram_mb, "dev_mb": self.dev_mb, "guest_ram_mb": self.guest_ram_mb,
                "dev_base": self.ram_mb * MIB,
                **{g.role: {"pid": g.pid, "qmp": g.qmp_path, "console": g.console, "dev_path": g.dev_path,
                            "log": g.log, "cmdline": self.cmdline(g.role)} for g in (self.src, self.dst)}}

    def close(self):
        for g in (self.src, self.dst):
            g.close()
        _unlink(os.path.join(self.workdir, "mig.sock"))
        if self in _live_pairs:
            _live_pairs.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- CLI ------------------------------------------------------------------------------------------

def _load_state(workdir):
    try:
        with open(os.path.join(workdir, "pair.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise HarnessError(f"no pair in {workdir}: {e}") from None


def _stop_state(workdir):
    try:
        st = _load_state(workdir)
    except HarnessError:
        return
    reaper = st.get("reaper_pid")
    if reaper and reaper != os.getpid():
        _kill_pid(reaper)
    for role in ("src", "dst"):
        _kill_pid(st[role]["pid"])
        _unlink(st[role]["dev_path"])
        _unlink(st[role]["qmp"])
    _unlink(os.path.join(workdir, "mig.sock"))
    _unlink(os.path.join(workdir, "pair.json"))


def _cli_guest(st, side):
    g = Guest(side, st["workdir"], st["tag"])
    g.pid = st[side]["pid"]
    return g


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start-pair")
    s.add_argument("--dir", required=True)
    s.add_argument("--guest", required=True)
    s.add_argument("--ram-mb", type=int, default=64)
    s.add_argument("--dev-mb", type=int, default=32)
    s.add_argument("--guest-ram-mb", type=int, default=32)
    s.add_argument("--period", type=int, default=10)
    s.add_argument("--every", type=int, default=1)
    s.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    s.add_argument("--max-life", type=int, default=300, help="seconds before the reaper stops the pair")
    q = sub.add_parser("qmp")
    q.add_argument("--dir", required=True)
    q.add_argument("--side", choices=("src", "dst"), required=True)
    q.add_argument("command")
    q.add_argument("arguments", nargs="?", default=None)
    q.add_argument("--timeout", type=float, default=10)
    w = sub.add_parser("wait-pass")
    w.add_argument("--dir", required=True)
    w.add_argument("--side", choices=("src", "dst"), required=True)
    w.add_argument("--pass", dest="min_pass", type=int, required=True)
    w.add_argument("--timeout", type=float, default=30)
    m = sub.add_parser("wait-migration")
    m.add_argument("--dir", required=True)
    m.add_argument("--side", choices=("src", "dst"), required=True)
    m.add_argument("--status", required=True)
    m.add_argument("--timeout", type=float, default=30)
    c = sub.add_parser("copy-device")
    c.add_argument("--dir", required=True)
    t = sub.add_parser("stop")
    t.add_argument("--dir", required=True)
    r = sub.add_parser("_reap")  # internal: the detached reaper
    r.add_argument("--dir", required=True)
    r.add_argument("--after", type=float, required=True)
    a = ap.parse_args(argv)
    workdir = os.path.abspath(a.dir)

    if a.cmd == "start-pair":
        _stop_state(workdir)  # a leftover pair in the same folder
        p = Pair(workdir, a.guest, a.ram_mb, a.dev_mb, a.guest_ram_mb, a.period, a.every,
                 accel=None if a.accel == "auto" else a.accel)
        try:
            p.start(die_with_parent=False)
            st = p.describe()
            st["reaper_pid"] = None
            with open(os.path.join(workdir, "pair.json"), "w") as f:
                json.dump(st, f)
            reaper = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_reap", "--dir", workdir,
                                       "--after", str(a.max_life)], start_new_session=True,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            st["reaper_pid"] = reaper.pid
            with open(os.path.join(workdir, "pair.json"), "w") as f:
                json.dump(st, f)
        except BaseException:
            p.close()
            raise
        _live_pairs.remove(p)  # handed over: the reaper or `stop` ends it
        print(json.dumps(st))
        return 0
    if a.cmd == "_reap":
        time.sleep(a.after)
        _stop_state(workdir)
        return 0
    if a.cmd == "stop":
        _stop_state(workdir)
        return 0
    st = _load_state(workdir)
    if a.cmd == "copy-device":
        copy_device(st["src"]["dev_path"], st["dst"]["dev_path"])
        return 0
    g = _cli_guest(st, a.side)
    if a.cmd == "qmp":
        args = json.loads(a.arguments) if a.arguments else None
        qmp = Qmp(g.qmp_path)
        try:
            print(json.dumps(qmp.execute(a.command, args, timeout_s=a.timeout)))
        finally:
            qmp.close()
        return 0
    if a.cmd == "wait-pass":
        print(json.dumps(g.wait_pass(a.min_pass, a.timeout)))
        return 0
    if a.cmd == "wait-migration":
        deadline = time.monotonic() + a.timeout
        qmp = Qmp(g.qmp_path)
        try:
            while True:
                info = qmp.execute("query-migrate")
                status = info.get("status", "none")
                if status == a.status:
                    print(json.dumps(info))
                    return 0
                if status in ("failed", "cancelled") or time.monotonic() > deadline:
                    raise HarnessError(f"{a.side} migration is {status}, waited for {a.status}: {json.dumps(info)}")
                time.sleep(0.02)
        finally:
            qmp.close()
    return 2


if __name__ == "__main__":
    install_cleanup_on_signals()
    try:
        sys.exit(main(sys.argv[1:]))
    except HarnessError as e:
        print(f"qemu_harness: {e}", file=sys.stderr)
        sys.exit(1)
