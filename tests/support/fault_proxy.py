#!/usr/bin/env python3
"""A TCP proxy between two gpumigrate processes that damages traffic on purpose.

Usage:
  fault_proxy.py LISTEN_PORT_FILE TARGET_PORT [--flip-after BYTES]
                 [--fault MODE] [--conn SPEC] [--after-bytes N] [--after-seconds S]
                 [--delay-ms MS] [--jitter-ms MS] [--seed N] [--rate BYTES_PER_SECOND]
                 [--trigger-signal] [--events FILE] [--seconds N]

Listens on 127.0.0.1 (any free port, written to LISTEN_PORT_FILE through a rename, so
a reader never sees half a number) and forwards every accepted connection to
127.0.0.1:TARGET_PORT. Nothing but loopback is ever bound or connected. Without a
fault the proxy is faithful: bytes pass unchanged in both directions, a peer's FIN
is passed on as a FIN (half-close), and a peer's error (a reset, a broken pipe)
shuts both sides down with a FIN, as the first version of this proxy did.

Connections are numbered in accept order: 0 is the first accepted (gpumigrate's
control connection), 1, 2, ... the data streams in the order they were accepted.

Options
  LISTEN_PORT_FILE      where the listening port is written.
  TARGET_PORT           the real server's port on 127.0.0.1.
  --seconds N           run for N seconds (default 60), then close everything and exit
                        0; SIGTERM and SIGINT do the same at once. Threads blocked on a
                        faulted connection never keep the process alive (os._exit).
  --flip-after BYTES    the first targeted connection whose client-to-server bytes pass
                        BYTES has the byte at offset BYTES XORed with 0xFF: once in the
                        whole run (a data frame damaged in flight). Targets every
                        connection unless --conn says otherwise. May be combined with
                        --fault.
  --fault MODE          one fault, applied from the trigger on to the connections that
                        --conn selects:
      blackhole  the connection stops forwarding in both directions and the proxy
                 stops reading from both of its sockets (the senders' buffers fill and
                 their writes block), but nothing is closed: no FIN, no RST. Lasts until
                 the proxy exits.
      stall      like blackhole, client-to-server only; server-to-client keeps flowing.
      reset      both sockets are closed with an RST (SO_LINGER on, linger 0); within
                 about 50 ms of the trigger.
      truncate   the client-to-server stream is forwarded exactly up to the trigger
                 byte, then both sides get a FIN (shutdown for writing); whatever
                 either peer sends afterwards is read and discarded.
      duplicate  the next client-to-server chunk forwarded after the trigger is sent
                 twice in a row (once in the whole run: a duplicated segment).
      delay      every chunk in both directions is held for --delay-ms plus a uniform
                 random 0..--jitter-ms before it is forwarded; the order within each
                 direction of a connection is kept (a chunk never overtakes the one
                 before it, so it may wait a little longer than its own draw).
      reorder    chunks of the targeted connections (both directions) are held for
                 --delay-ms while the other connections are not: data sent later on
                 another connection arrives first. Order within a connection is kept.
      rate       the targeted connections together are capped at --rate bytes per
                 second in each direction (one token bucket per direction, burst
                 min(64 KiB, rate/20)): a bandwidth collapse mid-transfer.
  --conn SPEC           which connections the fault (and --flip-after) applies to: an
                        index (0, 1, 2, ...), a comma-separated list of indices (1,2),
                        'data' (every connection after the first) or 'all' (default).
  --after-bytes N       trigger when N client-to-server bytes have been seen on the
                        targeted connections (counted over all of them together with
                        'all', 'data' or a list). Byte-exact for truncate, duplicate,
                        blackhole and stall: the first N bytes are forwarded, none after
                        (the proxy does not even read past byte N). Default 0 when no
                        --after-seconds is given: the fault is there from each
                        connection's connect.
  --after-seconds S     trigger S seconds after the proxy started. With --after-bytes
                        too, whichever comes first. Connections accepted after the
                        trigger get the fault at connect.
  --trigger-signal      trigger when the proxy receives SIGUSR1 (within about 20 ms;
                        with the other triggers, whichever comes first). The CLI's
                        test hook GPUMIGRATE_TEST_SIGNAL_AT=PHASE[:ROUND]@PID sends it
                        at an exact phase of the protocol.
  --armed-file PATH     with --trigger-signal: create PATH once the signal's fault has
                        taken hold (GPUMIGRATE_TEST_SIGNAL_ARMED=PATH makes the hook
                        wait for it, so the fault is there before the protocol goes on).
  --delay-ms MS         hold time for delay and reorder (default 0).
  --jitter-ms MS        delay only: an extra uniform random 0..MS per chunk (default 0).
  --seed N              seed of the jitter's random generator (default 0).
  --rate BPS            the cap for rate, in bytes per second.
  --events FILE         append one JSON object per line for every fault that fires,
                        flushed at once: {"fault": MODE, "conn": INDEX, "at_byte": N,
                        "t": SECONDS_SINCE_START}. at_byte is the number of client-to-
                        server bytes of that connection the proxy had read when the
                        fault took hold of it. A fault that applies to several
                        connections writes one line per connection; duplicate writes
                        its line when the doubled chunk has gone out and adds "len" (its
                        size); --flip-after writes {"fault": "flip", ...}. Each event is
                        also noted on stderr in one line.
"""
import argparse
import collections
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 16
TICK = 0.05                # how often a waiting thread looks at the flags again
DELAY_QUEUE_CAP = 16 << 20  # bytes a delay line holds before its reader waits
MODES = ("blackhole", "stall", "reset", "truncate", "duplicate", "delay", "reorder", "rate")


def wait_io(sock, write, timeout):
    """True when sock is readable (or writable), False on timeout."""
    p = select.poll()
    try:
        p.register(sock, select.POLLOUT if write else select.POLLIN)
    except (OSError, ValueError):
        return True  # closed under us: the next send/recv raises and says so
    try:
        return bool(p.poll(timeout * 1000))
    except InterruptedError:
        return False


def parse_conn(spec):
    """A predicate on connection indices for --conn SPEC."""
    if spec == "all":
        return lambda i: True
    if spec == "data":
        return lambda i: i >= 1
    try:
        wanted = {int(x) for x in spec.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--conn: expected an index, a list, 'data' or 'all', got {spec!r}")
    if any(i < 0 for i in wanted):
        raise argparse.ArgumentTypeError("--conn: indices are >= 0")
    return lambda i: i in wanted


class Bucket:
    """A token bucket shared by every rate-limited connection in one direction."""

    def __init__(self, rate):
        self.rate = float(rate)
        self.burst = max(1, min(CHUNK, int(rate) // 20))
        self.tokens = float(self.burst)
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n):
        """Takes n tokens (going into debt if need be); returns how long to wait."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            self.tokens -= n
            return max(0.0, -self.tokens / self.rate)


class Direction:
    """One direction of a connection: bytes read from src are written to dst."""

    def __init__(self, conn, src, dst, up):
        self.conn, self.src, self.dst, self.up = conn, src, dst, up
        self.paused = False   # blackhole/stall: neither read nor forward
        self.seen = 0         # bytes read from src
        self.line = None      # DelayLine, once delay/reorder holds this direction


class Conn:
    def __init__(self, proxy, index, client, server):
        self.proxy, self.index = proxy, index
        self.client, self.server = client, server
        self.targeted = proxy.targets(index)
        self.lock = threading.Lock()
        self.closing = threading.Event()  # set with style: 'rst', 'fin' or 'error'
        self.style = None
        self.faulted = False
        self.delayed = False
        self.rated = False
        self.live = 2
        self.up = Direction(self, client, server, True)
        self.down = Direction(self, server, client, False)

    def close_with(self, style):
        """Starts closing: 'rst' (reset), 'fin' (truncate) or 'error' (a peer failed)."""
        with self.lock:
            if self.style is not None:
                return
            self.style = style
        socks = (self.client, self.server)
        if style == "rst":
            for s in socks:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
        else:
            how = socket.SHUT_WR if style == "fin" else socket.SHUT_RDWR
            for s in socks:
                try:
                    s.shutdown(how)
                except OSError:
                    pass
        self.closing.set()

    def pump_done(self):
        """The last direction to finish closes both sockets; only it may (another
        thread could still be polling them). After a peer error they stay open until
        the proxy exits, as in the first version (no RST of our own making)."""
        with self.lock:
            self.live -= 1
            last = self.live == 0
        if last and self.style != "error":
            for s in (self.client, self.server):
                try:
                    s.close()
                except OSError:
                    pass


class DelayLine:
    """Holds chunks of one direction and forwards each at its release time, in order."""

    def __init__(self, proxy, d, delay, jitter):
        self.proxy, self.d, self.delay, self.jitter = proxy, d, delay, jitter
        self.q = collections.deque()
        self.bytes = 0
        self.last_release = 0.0
        self.closed = False   # no more puts: the thread ends once the queue is empty
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def stopped(self):
        return self.d.conn.closing.is_set() or self.proxy.stopping.is_set()

    def put(self, data):
        with self.cv:
            while self.bytes > DELAY_QUEUE_CAP and not self.stopped():
                self.cv.wait(TICK)
            hold = self.delay + (self.proxy.rng.uniform(0, self.jitter) if self.jitter else 0.0)
            release = max(time.monotonic() + hold, self.last_release)
            self.last_release = release
            self.q.append((release, data))
            self.bytes += len(data)
            self.cv.notify_all()

    def wait_empty(self):
        with self.cv:
            while self.q and not self.stopped():
                self.cv.wait(TICK)

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def run(self):
        conn = self.d.conn
        while True:
            with self.cv:
                while not self.q:
                    if self.stopped() or self.closed:
                        return
                    self.cv.wait(TICK)
                release, data = self.q[0]
            while not self.stopped() and time.monotonic() < release:
                conn.closing.wait(min(TICK, max(0.0, release - time.monotonic())))
            if self.stopped():
                return
            try:
                self.proxy.send(self.d, data)
            except OSError:
                conn.close_with("error")
                return
            with self.cv:
                self.q.popleft()
                self.bytes -= len(data)
                self.cv.notify_all()


class Proxy:
    def __init__(self, a):
        self.a = a
        self.t0 = time.monotonic()
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # the trigger, the byte count, the connection list
        self.conns = []
        self.targets = parse_conn(a.conn)
        self.mode = a.fault
        self.after_bytes = a.after_bytes
        if self.mode and a.after_bytes is None and a.after_seconds is None and not a.trigger_signal:
            self.after_bytes = 0
        self.counted = 0              # client-to-server bytes of targeted connections
        self.tripped = bool(self.mode) and self.after_bytes == 0
        self.dup_pending = self.tripped and self.mode == "duplicate"
        self.flipped = False
        self.rng = random.Random(a.seed)
        self.buckets = {True: Bucket(a.rate), False: Bucket(a.rate)} if self.mode == "rate" else None
        self.events_lock = threading.Lock()
        self.events = open(a.events, "a") if a.events else None

    # --- events -------------------------------------------------------------------

    def event(self, fault, conn, at_byte, **extra):
        t = time.monotonic() - self.t0
        rec = {"fault": fault, "conn": conn, "at_byte": at_byte, "t": round(t, 3), **extra}
        with self.events_lock:
            if self.events:
                self.events.write(json.dumps(rec) + "\n")
                self.events.flush()
            more = "".join(f", {k} {v}" for k, v in extra.items())
            print(f"fault_proxy: {fault} on connection {conn} at byte {at_byte} (t={t:.3f}s{more})",
                  file=sys.stderr, flush=True)

    # --- the trigger ----------------------------------------------------------------

    def fire(self):
        """The trigger has tripped: the fault takes hold of every targeted connection."""
        with self.lock:
            if self.mode == "duplicate":
                self.dup_pending = True
            conns = [c for c in self.conns if c.targeted and c.live > 0]  # not the closed ones
        for c in conns:
            self.activate(c)

    def time_trigger(self):
        with self.lock:
            if self.tripped:
                return
            self.tripped = True
        self.fire()

    def activate(self, c):
        with c.lock:
            if c.faulted:
                return
            c.faulted = True
        m = self.mode
        at = c.up.seen
        if m == "blackhole":
            c.up.paused = c.down.paused = True
        elif m == "stall":
            c.up.paused = True
        elif m == "reset":
            c.close_with("rst")
        elif m == "truncate":
            c.close_with("fin")
        elif m in ("delay", "reorder"):
            c.delayed = True
        elif m == "rate":
            c.rated = True
        if m != "duplicate":  # duplicate reports when the doubled chunk has gone out
            self.event(m, c.index, at)

    # --- moving bytes ---------------------------------------------------------------

    def send(self, d, data):
        """Writes all of data to d.dst unless the connection closes meanwhile."""
        c = d.conn
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            if c.closing.is_set() or self.stopping.is_set():
                return sent
            try:
                sent += d.dst.send(view[sent:])
            except (BlockingIOError, InterruptedError):
                wait_io(d.dst, True, TICK)
            except OSError:
                if c.closing.is_set():
                    return sent
                raise
        return sent

    def send_rated(self, d, data):
        bucket = self.buckets[d.up]
        for i in range(0, len(data), bucket.burst):
            piece = data[i:i + bucket.burst]
            wait = bucket.take(len(piece))
            if wait and d.conn.closing.wait(wait):
                return
            self.send(d, piece)

    def forward(self, d, data):
        c = d.conn
        if d.paused or c.closing.is_set():
            return  # blackholed/stalled bytes vanish; after reset/truncate, discarded
        if d.up and c.faulted and self.dup_pending:
            with self.lock:
                take, self.dup_pending = self.dup_pending, False
            if take:
                self.send(d, data)
                self.send(d, data)
                self.event("duplicate", c.index, d.seen - len(data), len=len(data))
                return
        if c.delayed:
            if d.line is None:
                jitter = self.a.jitter_ms / 1000 if self.mode == "delay" else 0.0
                d.line = DelayLine(self, d, self.a.delay_ms / 1000, jitter)
            d.line.put(data)
        elif c.rated:
            self.send_rated(d, data)
        else:
            self.send(d, data)

    def maybe_flip(self, d, data):
        fa = self.a.flip_after
        if fa < 0 or self.flipped or not d.conn.targeted or d.seen + len(data) <= fa:
            return data
        with self.lock:
            if self.flipped:
                return data
            self.flipped = True
        i = max(0, fa - d.seen)
        data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        self.event("flip", d.conn.index, fa)
        return data

    def handle(self, d, data):
        c = d.conn
        if d.up:
            data = self.maybe_flip(d, data)
        if d.up and self.mode and c.targeted and not c.faulted:
            # Split the chunk at the trigger byte: what comes before it passes as is.
            tripped_here = False
            with self.lock:
                if self.tripped:
                    pre, post = b"", data
                elif self.after_bytes is None:
                    pre, post = data, b""
                else:
                    room = self.after_bytes - self.counted
                    pre, post = data[:room], data[room:]
                    self.counted += len(pre)
                    if len(pre) == room:
                        self.tripped = tripped_here = True
            if pre:
                d.seen += len(pre)
                self.forward(d, pre)
            if tripped_here:
                self.fire()
            elif self.tripped:
                self.activate(c)  # tripped by another connection or by the clock
            if not post:
                return
            data = post
        d.seen += len(data)
        self.forward(d, data)

    def recv_size(self, d):
        c = d.conn
        if d.up and self.mode and c.targeted and not self.tripped and self.after_bytes is not None:
            return max(1, min(CHUNK, self.after_bytes - self.counted))  # never read past the trigger
        return CHUNK

    def drain(self, d):
        """After truncate: read and discard until the peer closes."""
        while not self.stopping.is_set():
            if not wait_io(d.src, False, TICK):
                continue
            try:
                if not d.src.recv(CHUNK):
                    return
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return

    def pump(self, d):
        c = d.conn
        try:
            while not self.stopping.is_set():
                if c.closing.is_set():
                    if c.style == "fin":
                        self.drain(d)
                    return
                if d.paused:
                    self.stopping.wait(TICK)  # do not read: let the sender's buffers fill
                    continue
                if not wait_io(d.src, False, TICK) or d.paused or c.closing.is_set():
                    continue
                try:
                    data = d.src.recv(self.recv_size(d))
                except (BlockingIOError, InterruptedError):
                    continue
                if not data:  # the peer's FIN: pass it on once what is held has gone
                    if d.line is not None:
                        d.line.wait_empty()
                    if not c.closing.is_set():
                        try:
                            d.dst.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                    return
                self.handle(d, data)
        except OSError:
            c.close_with("error")
        finally:
            if d.line is not None:
                d.line.close()
                d.line.thread.join(1.0)  # it stops within a tick once the connection closes
            c.pump_done()

    # --- accepting ------------------------------------------------------------------

    def serve(self, client, index):
        try:
            server = socket.create_connection(("127.0.0.1", self.a.target_port), timeout=5)
        except OSError:
            client.close()
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
        c = Conn(self, index, client, server)
        with self.lock:
            self.conns.append(c)
            now = self.tripped and c.targeted
        if now:
            self.activate(c)
        threading.Thread(target=self.pump, args=(c.up,), daemon=True).start()
        threading.Thread(target=self.pump, args=(c.down,), daemon=True).start()

    def run(self):
        a = self.a
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(64)
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{lsock.getsockname()[1]}\n")
        os.rename(tmp, a.port_file)

        for sig in (signal.SIGTERM, signal.SIGINT):
            # At once, taking no lock: a handler that waited on a lock the
            # interrupted code held would deadlock (events are flushed as written).
            signal.signal(sig, lambda *_: os._exit(0))
        if self.mode and a.after_seconds is not None and not self.tripped:
            t = threading.Timer(max(0.0, a.after_seconds - (time.monotonic() - self.t0)), self.time_trigger)
            t.daemon = True
            t.start()

        # A backstop: whatever the orderly exit below waits on, the proxy is gone
        # two seconds after --seconds.
        backstop = threading.Timer(a.seconds + 2, lambda: os._exit(0))
        backstop.daemon = True
        backstop.start()
        self.signalled = False
        if self.mode and a.trigger_signal:
            # Only a flag: the accept loop below trips the fault (no lock in a handler).
            signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "signalled", True))
        lsock.settimeout(0.02 if a.trigger_signal else 0.2)
        deadline = self.t0 + a.seconds
        index = 0
        while not self.stopping.is_set() and time.monotonic() < deadline:
            if self.signalled:
                self.signalled = False
                self.time_trigger()
                if a.armed_file:
                    with open(a.armed_file + ".tmp", "w") as f:
                        f.write("armed\n")
                    os.rename(a.armed_file + ".tmp", a.armed_file)
            try:
                client, _ = lsock.accept()
            except (socket.timeout, InterruptedError):
                continue
            self.serve(client, index)
            index += 1

        # Close everything and leave, whatever the other threads are blocked on.
        self.stopping.set()
        lsock.close()
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            for s in (c.client, c.server):
                try:
                    s.close()
                except OSError:
                    pass
        with self.events_lock:
            if self.events:
                self.events.close()
                self.events = None
        sys.stderr.flush()
        os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("port_file")
    ap.add_argument("target_port", type=int)
    ap.add_argument("--flip-after", type=int, default=-1)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--fault", choices=MODES)
    ap.add_argument("--conn", default="all")
    ap.add_argument("--after-bytes", type=int)
    ap.add_argument("--after-seconds", type=float)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--events")
    ap.add_argument("--trigger-signal", action="store_true")
    ap.add_argument("--armed-file")
    a = ap.parse_args()

    try:
        parse_conn(a.conn)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if not a.fault:
        for opt in ("after_bytes", "after_seconds", "rate"):
            if getattr(a, opt) is not None:
                ap.error(f"--{opt.replace('_', '-')} needs --fault")
        if a.delay_ms or a.jitter_ms:
            ap.error("--delay-ms and --jitter-ms need --fault delay or reorder")
    if a.trigger_signal and not a.fault:
        ap.error("--trigger-signal needs --fault")
    if a.armed_file and not a.trigger_signal:
        ap.error("--armed-file needs --trigger-signal")
    if a.after_bytes is not None and a.after_bytes < 0:
        ap.error("--after-bytes must be >= 0")
    if a.after_seconds is not None and a.after_seconds < 0:
        ap.error("--after-seconds must be >= 0")
    if a.delay_ms < 0 or a.jitter_ms < 0:
        ap.error("--delay-ms and --jitter-ms must be >= 0")
    if a.fault == "rate" and not (a.rate and a.rate > 0):
        ap.error("--fault rate needs --rate BYTES_PER_SECOND > 0")
    if a.fault == "reorder" and a.delay_ms <= 0:
        ap.error("--fault reorder needs --delay-ms > 0")
    if a.fault == "delay" and a.delay_ms <= 0 and a.jitter_ms <= 0:
        ap.error("--fault delay needs --delay-ms or --jitter-ms")
    Proxy(a).run()


if __name__ == "__main__":
    main()
