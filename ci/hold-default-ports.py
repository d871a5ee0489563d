#!/usr/bin/env python3
"""Holds Sluice's default ports on loopback (HTTP 9324/tcp, QUIC 7400/udp, metrics 9400/tcp,
Kafka 9092/tcp) while the test suite runs, as a broker a developer left running would: every
test must bind port 0, and one that binds a default port fails to start instead of passing
only on a quiet machine. A port something else holds already serves the same purpose. Runs
until it is killed (ci/test.sh kills it when the tests end)."""
import signal
import socket
import sys
import time

PORTS = [(9324, socket.SOCK_STREAM), (9400, socket.SOCK_STREAM), (9092, socket.SOCK_STREAM),
         (7400, socket.SOCK_DGRAM)]

held = []
for port, kind in PORTS:
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind(("127.0.0.1", port))
        if kind == socket.SOCK_STREAM:
            s.listen(1)
        held.append(s)
    except OSError as e:
        print(f"hold-default-ports: 127.0.0.1:{port} is held already ({e})", file=sys.stderr)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(f"hold-default-ports: holding {len(held)} default ports", file=sys.stderr, flush=True)
while True:
    time.sleep(3600)
