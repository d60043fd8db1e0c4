"""``python -m fastps``: runs the role named by FASTPS_ROLE (scheduler or server);
``python -m fastps --check-build`` shows what this installation can do.

Lets external launchers (SLURM, Kubernetes, mpirun, network-namespace harnesses) start every
non-worker process with one command line and the documented environment variables. Workers
are the user's own program.
"""

from __future__ import annotations

import sys

from fastps.config import stated_role
from fastps.errors import ConfigError


def main() -> None:
    if sys.argv[1:] == ["--check-build"]:
        from fastps.launch.check_build import main as check_build

        sys.exit(check_build())
    try:
        role = stated_role()
    except ConfigError as exc:  # neither scheduler nor server, nor worker
        print(f"python -m fastps: {exc}", file=sys.stderr)
        sys.exit(2)
    if role == "scheduler":
        from fastps.control.scheduler import main as run
    elif role == "server":
        from fastps.control.server import main as run
    else:
        print(
            f"python -m fastps: FASTPS_ROLE={role or '(unset)'}: expected 'scheduler' or "
            "'server' (workers run your training script)",
            file=sys.stderr,
        )
        sys.exit(2)
    run()


if __name__ == "__main__":
    main()
