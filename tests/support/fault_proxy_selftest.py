#!/usr/bin/env python3
"""Self-test of fault_proxy.py: every fault mode, checked for real over loopback.

Usage: fault_proxy_selftest.py [--proxy PATH] [--only NAME[,NAME...]]

Starts a small echo/sink server on 127.0.0.1 (port 0) in a thread and fault_proxy.py as
a subprocess in front of it (its port read from the port file), then drives clients
through the proxy and checks what the server and the clients really saw, and that the
events file says the fault fired. Exit 0 when every check passes; 1 with a message at
the first failure. --proxy tests another copy of the proxy (used to check that these
checks can fail); --only runs some tests by name. Runs in about 25 s.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.path.join(HERE, "fault_proxy.py")


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def wait_until(pred, timeout, step=0.01):
    end = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(step)


def pattern(n, seed):
    return random.Random(seed).randbytes(n)


# --- the server behind the proxy ------------------------------------------------------

class Record:
    """What the server saw on one accepted connection."""

    def __init__(self, sock):
        self.sock = sock
        self.data = bytearray()
        self.arrivals = []            # (monotonic time, total bytes so far)
        self.ended = threading.Event()
        self.eof = False              # ended with a clean EOF
        self.error = None             # ended with this exception
        self.lock = threading.Lock()

    def __len__(self):
        with self.lock:
            return len(self.data)

    def bytes(self):
        with self.lock:
            return bytes(self.data)

    def time_reaching(self, n):
        with self.lock:
            for t, total in self.arrivals:
                if total >= n:
                    return t
        return None


class Server:
    """Accepts on 127.0.0.1:0; records every connection; echoes when echo=True; answers
    a FIN with a FIN (the socket itself stays open until close())."""

    def __init__(self, echo=False):
        self.echo = echo
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.recs = []
        self.lock = threading.Lock()
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            r = Record(s)
            with self.lock:
                self.recs.append(r)
            threading.Thread(target=self.handle, args=(r,), daemon=True).start()

    def handle(self, r):
        try:
            while True:
                b = r.sock.recv(1 << 16)
                if not b:
                    r.eof = True
                    r.sock.shutdown(socket.SHUT_WR)  # answer the FIN with one
                    break
                with r.lock:
                    r.data += b
                    r.arrivals.append((time.monotonic(), len(r.data)))
                if self.echo:
                    r.sock.sendall(b)
        except OSError as e:
            r.error = e
        r.ended.set()

    def conn(self, i, timeout=3.0):
        check(wait_until(lambda: len(self.recs) > i, timeout), f"the server never saw connection {i}")
        return self.recs[i]

    def close(self):
        self.lsock.close()
        for r in self.recs:
            try:
                r.sock.close()
            except OSError:
                pass


# --- the proxy under test -------------------------------------------------------------

class Proxy:
    def __init__(self, path, target_port, *args, seconds=20, events=True):
        self.dir = tempfile.mkdtemp(prefix="fault_proxy_selftest.")
        self.port_file = os.path.join(self.dir, "port")
        self.events_file = os.path.join(self.dir, "events.jsonl") if events else None
        self.err_file = os.path.join(self.dir, "stderr")
        cmd = [sys.executable, path, self.port_file, str(target_port), *map(str, args), "--seconds", str(seconds)]
        if events:
            cmd += ["--events", self.events_file]
        self.cmd = cmd
        self.err = open(self.err_file, "w")
        self.proc = subprocess.Popen(cmd, stderr=self.err, stdin=subprocess.DEVNULL)
        ok = wait_until(lambda: os.path.exists(self.port_file) or self.proc.poll() is not None, 5)
        check(ok and self.proc.poll() is None, f"the proxy did not start: {' '.join(cmd)}\n{self.stderr()}")
        self.started = time.monotonic()
        with open(self.port_file) as f:
            self.port = int(f.read())

    def connect(self, timeout=5.0):
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def stderr(self):
        self.err.flush()
        with open(self.err_file) as f:
            return f.read()

    def events(self):
        if not self.events_file or not os.path.exists(self.events_file):
            return []
        with open(self.events_file) as f:
            return [json.loads(line) for line in f if line.strip()]

    def wait_events(self, n, timeout=3.0):
        wait_until(lambda: len(self.events()) >= n, timeout)
        return self.events()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def expect_events(proxy, want, timeout=3.0):
    """want: a list of (fault, conn, at_byte or None); the events must be exactly these."""
    ev = proxy.wait_events(len(want), timeout)
    got = sorted((e["fault"], e["conn"]) for e in ev)
    check(got == sorted((f, c) for f, c, _ in want), f"events: expected {want}, got {ev}")
    for f, c, at in want:
        e = next(e for e in ev if e["fault"] == f and e["conn"] == c)
        check(at is None or e["at_byte"] == at, f"event {e}: expected at_byte {at}")
        check(isinstance(e["t"], (int, float)) and e["t"] >= 0, f"event {e}: bad t")
    return ev


def recv_exact(sock, n, timeout):
    sock.settimeout(timeout)
    buf = bytearray()
    while len(buf) < n:
        b = sock.recv(n - len(buf))
        if not b:
            raise Fail(f"EOF after {len(buf)} of {n} bytes")
        buf += b
    return bytes(buf)


def recv_outcome(sock, timeout):
    """What one recv gives: 'data', 'eof', 'timeout', 'reset' or the exception's name."""
    sock.settimeout(timeout)
    try:
        return "data" if sock.recv(1 << 16) else "eof"
    except socket.timeout:
        return "timeout"
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    except OSError as e:
        return type(e).__name__


def echo_ok(sock, msg=b"hello through the proxy", timeout=2.0):
    sock.sendall(msg)
    return recv_exact(sock, len(msg), timeout) == msg


# --- the tests ------------------------------------------------------------------------

def test_flip(path):
    """The original command line: exactly one byte flipped, once in the whole run."""
    srv = Server()
    p = Proxy(path, srv.port, "--flip-after", 1000, events=False)
    try:
        sent = pattern(5000, 1)
        for i in range(2):
            c = p.connect()
            c.sendall(sent)
            c.shutdown(socket.SHUT_WR)
            r = srv.conn(i)
            check(r.ended.wait(3) and r.eof, f"flip: connection {i} did not end with EOF (error {r.error})")
            got = r.bytes()
            check(len(got) == len(sent), f"flip: connection {i}: {len(got)} bytes arrived, {len(sent)} sent")
            diff = [j for j in range(len(sent)) if got[j] != sent[j]]
            if i == 0:
                check(diff == [1000] and got[1000] == sent[1000] ^ 0xFF,
                      f"flip: expected exactly byte 1000 XORed with 0xFF, differing offsets {diff[:10]}")
            else:
                check(diff == [], f"flip: the second connection was damaged too at {diff[:10]} (once per run)")
            check(recv_outcome(c, 2) == "eof", "flip: the client did not get the server's FIN")
            c.close()
        check("flip" in p.stderr(), f"flip: no note on stderr: {p.stderr()!r}")
    finally:
        p.stop()
        srv.close()


def test_truncate(path):
    """Exactly N bytes then EOF at the server; the client gets a FIN, no reset.
    --after-seconds 30 as well: the byte trigger comes first."""
    srv = Server()
    n = 100000
    p = Proxy(path, srv.port, "--fault", "truncate", "--after-bytes", n, "--after-seconds", 30)
    try:
        c = p.connect()
        sent = pattern(1 << 20, 2)
        t = threading.Thread(target=lambda: _sendall_quiet(c, sent), daemon=True)
        t.start()
        r = srv.conn(0)
        check(r.ended.wait(3), f"truncate: the server saw no end after {len(r)} bytes")
        check(r.eof and r.error is None, f"truncate: the server's stream ended with {r.error!r}, not EOF")
        got = r.bytes()
        check(len(got) == n, f"truncate: the server received {len(got)} bytes, expected exactly {n}")
        check(got == sent[:n], "truncate: the bytes before the cut were altered")
        out = recv_outcome(c, 3)
        check(out == "eof", f"truncate: the client got {out}, expected a FIN (eof)")
        expect_events(p, [("truncate", 0, n)])
        t.join(3)
        c.close()
    finally:
        p.stop()
        srv.close()


def _sendall_quiet(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_duplicate(path):
    """The chunk at the trigger byte arrives twice; everything else once, in order."""
    srv = Server()
    n = 5000
    p = Proxy(path, srv.port, "--fault", "duplicate", "--after-bytes", n)
    try:
        c = p.connect()
        sent = pattern(11000, 3)
        for a, b in ((0, 5000), (5000, 8000), (8000, 11000)):
            c.sendall(sent[a:b])
            time.sleep(0.15)
        c.shutdown(socket.SHUT_WR)
        r = srv.conn(0)
        check(r.ended.wait(3) and r.eof, f"duplicate: the server's stream did not end with EOF ({r.error!r})")
        ev = expect_events(p, [("duplicate", 0, n)])
        k = ev[0].get("len", 0)
        check(k > 0, f"duplicate: the event has no positive len: {ev[0]}")
        got = r.bytes()
        want = sent[:n + k] + sent[n:n + k] + sent[n + k:]
        check(len(got) == len(sent) + k, f"duplicate: {len(got)} bytes arrived, expected {len(sent)} + {k}")
        check(got == want, "duplicate: the server's bytes are not the stream with the chunk at the trigger doubled")
        c.close()
    finally:
        p.stop()
        srv.close()


def test_reset(path):
    """Both sides see a reset (RST), not a FIN."""
    srv = Server()
    n = 10000
    p = Proxy(path, srv.port, "--fault", "reset", "--after-bytes", n)
    try:
        c = p.connect()
        c.settimeout(5)
        outcome = None
        try:
            c.sendall(pattern(1 << 20, 4))
        except (ConnectionResetError, BrokenPipeError):
            outcome = "reset"
        except socket.timeout:
            outcome = "timeout"
        if outcome is None:
            outcome = recv_outcome(c, 3)
        check(outcome == "reset", f"reset: the client saw {outcome}, expected ECONNRESET/EPIPE")
        r = srv.conn(0)
        check(r.ended.wait(3), "reset: the server's connection did not end")
        check(isinstance(r.error, ConnectionResetError), f"reset: the server saw {r.error!r} (eof={r.eof}), expected ECONNRESET")
        check(len(r) <= n, f"reset: the server received {len(r)} bytes, more than the {n} before the trigger")
        expect_events(p, [("reset", 0, n)])
        c.close()
    finally:
        p.stop()
        srv.close()


def test_blackhole(path):
    """Past byte N nothing moves either way, and nothing is closed."""
    srv = Server()
    n = 200000
    p = Proxy(path, srv.port, "--fault", "blackhole", "--after-bytes", n)
    try:
        c = p.connect()
        sent = pattern(n, 5) + bytes(64 << 20)
        c.settimeout(2)
        try:
            c.sendall(sent)
            outcome = "completed"
        except socket.timeout:
            outcome = "timeout"
        except OSError as e:
            outcome = repr(e)
        check(outcome == "timeout", f"blackhole: the client's sendall of 64 MB {outcome}, expected it to block")
        r = srv.conn(0)
        time.sleep(0.3)
        check(len(r) == n, f"blackhole: the server received {len(r)} bytes, expected exactly {n}")
        check(r.bytes() == sent[:n], "blackhole: the bytes before the trigger were altered")
        check(not r.ended.is_set(), f"blackhole: the server's connection ended (eof={r.eof}, {r.error!r})")
        r.sock.sendall(b"ping")
        out = recv_outcome(c, 1)
        check(out == "timeout", f"blackhole: the client's recv gave {out}: server-to-client must vanish too, no FIN/RST")
        check(not r.ended.is_set(), "blackhole: the server's connection ended")
        expect_events(p, [("blackhole", 0, n)])
        c.close()
    finally:
        p.stop()
        srv.close()


def test_stall(path):
    """Client-to-server stops at byte N; server-to-client still flows."""
    srv = Server()
    n = 200000
    p = Proxy(path, srv.port, "--fault", "stall", "--after-bytes", n)
    try:
        c = p.connect()
        c.settimeout(2)
        try:
            c.sendall(bytes(64 << 20))
            outcome = "completed"
        except socket.timeout:
            outcome = "timeout"
        except OSError as e:
            outcome = repr(e)
        check(outcome == "timeout", f"stall: the client's sendall of 64 MB {outcome}, expected it to block")
        r = srv.conn(0)
        time.sleep(0.3)
        check(len(r) == n, f"stall: the server received {len(r)} bytes, expected exactly {n}")
        back = pattern(1 << 20, 6)
        r.sock.sendall(back)
        got = recv_exact(c, len(back), 3)
        check(got == back, "stall: server-to-client bytes were altered")
        check(len(r) == n and not r.ended.is_set(), "stall: client-to-server moved or ended after the stall")
        expect_events(p, [("stall", 0, n)])
        c.close()
    finally:
        p.stop()
        srv.close()


def test_delay(path):
    """Each direction is held >= delay-ms; with jitter the order is still kept."""
    srv = Server(echo=True)
    p = Proxy(path, srv.port, "--fault", "delay", "--delay-ms", 300, "--jitter-ms", 40, "--seed", 7)
    try:
        c = p.connect()
        for i in range(3):
            t0 = time.monotonic()
            check(echo_ok(c, b"ping %d" % i, 3), "delay: the echo came back wrong")
            rtt = time.monotonic() - t0
            check(0.6 <= rtt < 2.0, f"delay: a round trip took {rtt:.3f} s, expected >= 0.6 s (300 ms each way)")
        msgs = [pattern(100, 100 + i) for i in range(40)]
        for m in msgs:
            c.sendall(m)
            time.sleep(0.004)
        got = recv_exact(c, 4000, 5)
        check(got == b"".join(msgs), "delay: the jittered chunks came back out of order or altered")
        expect_events(p, [("delay", 0, 0)])
        c.close()
    finally:
        p.stop()
        srv.close()


def test_reorder(path):
    """Connection 0 is held 500 ms, connection 1 is not: data sent later on 1 arrives first."""
    srv = Server()
    p = Proxy(path, srv.port, "--fault", "reorder", "--conn", 0, "--delay-ms", 500)
    try:
        c0 = p.connect()
        r0 = srv.conn(0)
        c1 = p.connect()
        r1 = srv.conn(1)
        t0 = time.monotonic()
        c0.sendall(b"A" * 100)
        time.sleep(0.05)
        c1.sendall(b"B" * 100)
        check(wait_until(lambda: len(r0) == 100 and len(r1) == 100, 3), "reorder: the data did not arrive")
        check(r0.bytes() == b"A" * 100 and r1.bytes() == b"B" * 100, "reorder: wrong bytes")
        a0, a1 = r0.time_reaching(1) - t0, r1.time_reaching(1) - t0
        check(a1 < a0, f"reorder: connection 1's data (sent later) arrived at {a1:.3f} s, not before connection 0's at {a0:.3f} s")
        check(a0 >= 0.5, f"reorder: connection 0 was held only {a0:.3f} s, expected >= 0.5 s")
        check(a1 < 0.3, f"reorder: connection 1 was held {a1:.3f} s; it is not targeted")
        expect_events(p, [("reorder", 0, 0)])
        c0.close()
        c1.close()
    finally:
        p.stop()
        srv.close()


def test_rate(path):
    """Fast up to 1 MB, then capped at 1 MB/s: the next 2 MB take >= 1.5 s."""
    srv = Server()
    n = 1000000
    p = Proxy(path, srv.port, "--fault", "rate", "--rate", 1000000, "--after-bytes", n)
    try:
        c = p.connect()
        t0 = time.monotonic()
        threading.Thread(target=lambda: _sendall_quiet(c, bytes(3 * n)), daemon=True).start()
        r = srv.conn(0)
        check(wait_until(lambda: len(r) >= 3 * n, 10), f"rate: only {len(r)} of {3 * n} bytes arrived in 10 s")
        t1, t2 = r.time_reaching(n) - t0, r.time_reaching(3 * n) - t0
        check(t1 < 1.0, f"rate: the first MB, before the trigger, took {t1:.3f} s")
        check(1.5 <= t2 - t1 <= 6.0, f"rate: 2 MB at 1 MB/s took {t2 - t1:.3f} s, expected 1.5..6 s")
        expect_events(p, [("rate", 0, n)])
        c.close()
    finally:
        p.stop()
        srv.close()


def test_rate_shared(path):
    """The cap holds for the targeted connections together: two streams of 1 MB each,
    sent at once at 1 MB/s in all, take >= 1.5 s."""
    srv = Server()
    p = Proxy(path, srv.port, "--fault", "rate", "--rate", 1000000)
    try:
        cs, rs = [], []
        for i in range(2):
            cs.append(p.connect())
            rs.append(srv.conn(i))
        t0 = time.monotonic()
        for c in cs:
            threading.Thread(target=lambda c=c: _sendall_quiet(c, bytes(1000000)), daemon=True).start()
        done = lambda: all(len(r) >= 1000000 for r in rs)
        check(wait_until(done, 10), f"rate (shared): only {[len(r) for r in rs]} bytes arrived in 10 s")
        t = max(r.time_reaching(1000000) for r in rs) - t0
        check(1.5 <= t <= 6.0, f"rate (shared): 2 x 1 MB at 1 MB/s in all took {t:.3f} s, expected 1.5..6 s")
        expect_events(p, [("rate", 0, 0), ("rate", 1, 0)])
        for c in cs:
            c.close()
    finally:
        p.stop()
        srv.close()


def test_conn_index(path):
    """A reset on connection 1 leaves connections 0 and 2 intact."""
    srv = Server(echo=True)
    p = Proxy(path, srv.port, "--fault", "reset", "--conn", 1)
    try:
        cs = []
        reset_at_connect = False
        for i in range(3):
            try:
                cs.append(p.connect())
            except ConnectionResetError:
                # The proxy resets connection 1 as soon as it accepts it: a client
                # thread scheduled late finds the RST already there when its
                # (non-blocking) connect completes. Only connection 1 may.
                check(i == 1, f"--conn 1: connection {i} was reset while connecting")
                reset_at_connect = True
                cs.append(None)
            srv.conn(i)
        check(echo_ok(cs[0]), "--conn 1: connection 0 does not echo")
        out = "reset" if reset_at_connect else recv_outcome(cs[1], 2)
        check(out == "reset", f"--conn 1: connection 1 saw {out}, expected a reset")
        check(echo_ok(cs[0]) and echo_ok(cs[2]), "--conn 1: connection 0 or 2 broke after connection 1's reset")
        expect_events(p, [("reset", 1, 0)])
        for c in cs:
            if c is not None:
                c.close()
    finally:
        p.stop()
        srv.close()


def test_conn_data(path):
    """--conn data truncates every connection but the first (the control connection)."""
    srv = Server(echo=True)
    p = Proxy(path, srv.port, "--fault", "truncate", "--conn", "data")
    try:
        cs = []
        for i in range(3):
            cs.append(p.connect())
            srv.conn(i)
        for i in (1, 2):
            out = recv_outcome(cs[i], 2)
            check(out == "eof", f"--conn data: connection {i} saw {out}, expected a FIN")
        check(echo_ok(cs[0]), "--conn data: connection 0 was touched")
        expect_events(p, [("truncate", 1, 0), ("truncate", 2, 0)])
        for c in cs:
            c.close()
    finally:
        p.stop()
        srv.close()


def test_shared_count(path):
    """--conn all counts the targeted connections' bytes together: 2000 on 0, then the
    trigger at 3000 falls at byte 1000 of connection 1; both are cut there."""
    srv = Server()
    p = Proxy(path, srv.port, "--fault", "truncate", "--conn", "all", "--after-bytes", 3000)
    try:
        c0 = p.connect()
        r0 = srv.conn(0)
        c1 = p.connect()
        r1 = srv.conn(1)
        c0.sendall(pattern(2000, 8))
        check(wait_until(lambda: len(r0) == 2000, 3), "shared count: connection 0's 2000 bytes did not arrive")
        sent1 = pattern(2000, 9)
        c1.sendall(sent1)
        check(r1.ended.wait(3) and r1.eof, f"shared count: connection 1 was not cut with a FIN ({r1.error!r})")
        check(r1.bytes() == sent1[:1000], f"shared count: connection 1 delivered {len(r1)} bytes, expected 1000")
        check(r0.ended.wait(3) and r0.eof and len(r0) == 2000, "shared count: connection 0 was not cut at its 2000 bytes")
        expect_events(p, [("truncate", 1, 1000), ("truncate", 0, 2000)])
        c0.close()
        c1.close()
    finally:
        p.stop()
        srv.close()


def test_after_seconds(path):
    """--after-seconds 1 (with an --after-bytes that never comes): fine before, blackholed after."""
    srv = Server(echo=True)
    p = Proxy(path, srv.port, "--fault", "blackhole", "--after-seconds", 1, "--after-bytes", 1 << 30)
    try:
        c = p.connect()
        check(echo_ok(c), "after-seconds: the connection did not work before the trigger")
        check(not p.events(), f"after-seconds: a fault fired early: {p.events()}")
        time.sleep(max(0.0, p.started + 1.3 - time.monotonic()))
        c.sendall(b"x")
        out = recv_outcome(c, 1)
        check(out == "timeout", f"after-seconds: after the trigger the echo gave {out}, expected nothing")
        ev = expect_events(p, [("blackhole", 0, None)])
        check(1.0 <= ev[0]["t"] < 1.6, f"after-seconds: fired at t={ev[0]['t']}, expected about 1.0")
        c.close()
    finally:
        p.stop()
        srv.close()


def test_trigger_signal(path):
    """--trigger-signal: fine until SIGUSR1, blackholed from then on (and nothing before it)."""
    srv = Server(echo=True)
    p = Proxy(path, srv.port, "--fault", "blackhole", "--trigger-signal")
    try:
        c = p.connect()
        check(echo_ok(c), "trigger-signal: the connection did not work before the signal")
        time.sleep(0.3)
        check(echo_ok(c), "trigger-signal: the fault started without a signal")
        check(not p.events(), f"trigger-signal: a fault fired early: {p.events()}")
        p.proc.send_signal(signal.SIGUSR1)
        expect_events(p, [("blackhole", 0, None)], timeout=1.0)
        c.sendall(b"x")
        out = recv_outcome(c, 1)
        check(out == "timeout", f"trigger-signal: after the signal the echo gave {out}, expected nothing")
        c.close()
    finally:
        p.stop()
        srv.close()


def test_bounded(path):
    """The proxy exits (0) after --seconds and on SIGTERM, even with blocked connections."""
    srv = Server()
    p = Proxy(path, srv.port, "--fault", "blackhole", seconds=1.5)
    try:
        c = p.connect()
        threading.Thread(target=lambda: _sendall_quiet(c, bytes(64 << 20)), daemon=True).start()
        try:
            rc = p.proc.wait(max(0.1, p.started + 3.0 - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise Fail("bounded: the proxy outlived --seconds 1.5 by more than 1.5 s")
        check(rc == 0, f"bounded: the proxy exited {rc} after --seconds, expected 0")
        out = recv_outcome(c, 2)
        check(out in ("eof", "reset"), f"bounded: the client's connection was not closed at exit ({out})")
        c.close()
    finally:
        p.stop()
        srv.close()

    srv = Server()
    p = Proxy(path, srv.port, "--fault", "stall", seconds=30)
    try:
        c = p.connect()
        threading.Thread(target=lambda: _sendall_quiet(c, bytes(64 << 20)), daemon=True).start()
        time.sleep(0.3)
        t0 = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        try:
            rc = p.proc.wait(2)
        except subprocess.TimeoutExpired:
            raise Fail("bounded: the proxy did not exit within 2 s of SIGTERM")
        check(rc == 0, f"bounded: the proxy exited {rc} on SIGTERM, expected 0")
        check(time.monotonic() - t0 < 2, "bounded: SIGTERM took too long")
        c.close()
    finally:
        p.stop()
        srv.close()


TESTS = [test_flip, test_truncate, test_duplicate, test_reset, test_blackhole, test_stall, test_delay,
         test_reorder, test_rate, test_rate_shared, test_conn_index, test_conn_data, test_shared_count, test_after_seconds, test_trigger_signal,
         test_bounded]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", default=PROXY)
    ap.add_argument("--only")
    a = ap.parse_args()
    names = set(a.only.split(",")) if a.only else None
    t_all = time.monotonic()
    for test in TESTS:
        name = test.__name__[len("test_"):]
        if names and name not in names:
            continue
        t0 = time.monotonic()
        try:
            test(a.proxy)
        except Fail as e:
            print(f"FAIL: {name}: {e}")
            return 1
        except Exception as e:  # an unexpected error is a failure too, with its reason
            print(f"FAIL: {name}: {type(e).__name__}: {e}")
            return 1
        print(f"ok: {name} ({time.monotonic() - t0:.1f} s)")
    print(f"fault_proxy selftest: all passed in {time.monotonic() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
