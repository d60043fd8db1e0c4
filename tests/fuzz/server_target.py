"""A summation server for the wire fuzzer: ``python server_target.py JOB TOKEN NUM_WORKERS``.

Prints its port, serves until stdin closes, then prints ``error: <text>`` and exits 0. The
fuzzer watches this process: any other exit (a signal, a sanitizer report) is a failure.
"""

from __future__ import annotations

import sys

from fastps import _core  # type: ignore[attr-defined]


def main() -> None:
    job_id, token, num_workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    srv = _core.Server(num_workers, job_id, token, "127.0.0.1", 0, 2, 2)
    print(srv.start(), flush=True)
    sys.stdin.read()
    print(f"error: {srv.error()}", flush=True)
    srv.stop()


if __name__ == "__main__":
    main()
