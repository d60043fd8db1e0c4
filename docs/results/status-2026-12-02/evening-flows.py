"""The same bytes over P concurrent TCP connections from one rack host to another (2026-12-02).

Run inside the hosts' namespaces by evening-flows.sh: ``recv PORT P TOTAL`` on the receiver,
``send ADDR PORT P TOTAL`` on the sender; each connection carries TOTAL / P bytes in 1 MiB
writes and reads, and the sender prints the transfer's wall time.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

CHUNK = 1 << 20


def recv(port: int, p: int, total: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)
    srv.settimeout(60)
    conns = [srv.accept()[0] for _ in range(p)]

    def rx(c: socket.socket, n: int) -> None:
        buf = memoryview(bytearray(CHUNK))
        got = 0
        while got < n:
            k = c.recv_into(buf, min(CHUNK, n - got))
            if k == 0:
                break
            got += k
        c.sendall(b"k")

    threads = [threading.Thread(target=rx, args=(c, total // p)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def send(addr: str, port: int, p: int, total: int) -> None:
    conns = []
    for _ in range(p):
        for _ in range(200):  # the receiver may still be starting: 10 s at most
            try:
                conns.append(socket.create_connection((addr, port), timeout=60))
                break
            except OSError:
                time.sleep(0.05)
    data = memoryview(bytes(CHUNK))

    def tx(c: socket.socket, n: int) -> None:
        sent = 0
        while sent < n:
            k = min(CHUNK, n - sent)
            c.sendall(data[:k])
            sent += k
        c.recv(1)

    t0 = time.time()
    threads = [threading.Thread(target=tx, args=(c, total // p)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"P={p} {total / 1e6:.0f} MB in {time.time() - t0:.3f} s", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
