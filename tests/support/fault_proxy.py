#!/usr/bin/env python3
"""A TCP proxy between two gpumigrate processes that damages traffic on purpose.

Usage: fault_proxy.py LISTEN_PORT_FILE TARGET_PORT [--flip-after BYTES] [--seconds N]

Listens on 127.0.0.1 (any free port, written to LISTEN_PORT_FILE) and forwards every
connection to 127.0.0.1:TARGET_PORT. With --flip-after, the first connection whose
client-to-server bytes pass BYTES has the byte at that position XORed with 0xFF (once,
in the whole run): a data frame damaged in flight. Exits after --seconds (default 60),
or when killed; only loopback is used.
"""
import argparse
import os
import selectors
import socket
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port_file")
    ap.add_argument("target_port", type=int)
    ap.add_argument("--flip-after", type=int, default=-1)
    ap.add_argument("--seconds", type=float, default=60)
    a = ap.parse_args()

    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{lsock.getsockname()[1]}\n")
    os.rename(tmp, a.port_file)

    flipped = threading.Event()
    lock = threading.Lock()

    def pump(src, dst, upstream):
        seen = 0
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if upstream and a.flip_after >= 0 and not flipped.is_set() and seen + len(data) > a.flip_after:
                    with lock:
                        if not flipped.is_set():
                            i = max(0, a.flip_after - seen)
                            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
                            flipped.set()
                            print(f"fault_proxy: flipped byte {a.flip_after} of a connection", file=sys.stderr)
                seen += len(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve(client):
        try:
            server = socket.create_connection(("127.0.0.1", a.target_port))
        except OSError:
            client.close()
            return
        threading.Thread(target=pump, args=(client, server, True), daemon=True).start()
        threading.Thread(target=pump, args=(server, client, False), daemon=True).start()

    lsock.settimeout(0.2)
    deadline = time.monotonic() + a.seconds
    while time.monotonic() < deadline:
        try:
            c, _ = lsock.accept()
        except socket.timeout:
            continue
        serve(c)


if __name__ == "__main__":
    main()
