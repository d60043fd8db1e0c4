"""A summation server for the wire fuzzer: ``python server_target.py JOB TOKEN NUM_WORKERS``.

Prints its port, serves until stdin closes, then prints ``error: <text>`` and exits 0. The
fuzzer watches this process: any other exit (a signal, a sanitizer report) is a failure.
"""

from __future__ import annotations

import sys

from fastps import _core
from fastps.config import Config
from fastps.control.server import server_options


def main() -> None:
    job_id, token, num_workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = Config(
        num_workers=num_workers, job_id=job_id, token=token, host="127.0.0.1", server_port=0
    )
    srv = _core.Server(server_options(cfg))
    print(srv.start(), flush=True)
    sys.stdin.read()
    print(f"error: {srv.error()}", flush=True)
    srv.stop()


if __name__ == "__main__":
    main()
