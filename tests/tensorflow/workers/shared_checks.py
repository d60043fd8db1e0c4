"""Runs several worker scripts of this folder one after the other in one process of one job,
so that a group of tests pays TensorFlow's start (seconds of CPU per process) once
(tests/tensorflow/tfjobs.py, ``shared_job``; the tests ask for their check through the
``shared_check`` fixture of tests/tensorflow/conftest.py).

Usage: shared_checks.py JSON, JSON a list of ``[name, script, arg...]``. Each script runs as
``__main__`` with ``sys.argv = [script, arg...]``, between the lines
``@@check begin NAME`` and ``@@check end NAME rc=N`` on stdout and on stderr, so that each
check's output can be told apart. After each check the plugin's session is shut down if the
script left it open (its process sets and op names go with it). A check that fails (an
exception, or a non-zero exit) ends the job: what a failed check leaves behind (a peer
waiting in an operation this rank gave up) could fail the next ones for the wrong reason.
"""

from __future__ import annotations

import json
import runpy
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _say(text: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        print(text, file=stream, flush=True)


def _run(script: str, args: list) -> int:
    path = Path(script) if Path(script).is_absolute() else HERE / script
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))  # as ``python script`` puts it first
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            print(f"{path.name} exited with {exc.code!r}", file=sys.stderr, flush=True)
            return 1
    except BaseException:  # noqa: BLE001 - the check's failure, reported below
        traceback.print_exc()
        return 1
    finally:
        sys.path.remove(str(path.parent))
        hvd = sys.modules.get("fastps.tensorflow")
        if hvd is not None and hvd.is_initialized():
            hvd.shutdown()
    return 0


def main() -> int:
    checks = json.loads(sys.argv[1])
    argv0 = list(sys.argv)
    for name, script, *args in checks:
        _say(f"@@check begin {name}")
        rc = _run(script, args)
        sys.argv = argv0
        _say(f"@@check end {name} rc={rc}")
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
