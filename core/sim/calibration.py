"""Moved: the simulator's calibration against the emulated rack is a benchmark now.

It replays the measurements stored in the fastps source tree (docs/results/), which an
installed package does not have, so it lives beside the benchmarks that wrote them. From
the root of a fastps checkout::

    python -m benchmarks.sim_calibration            # the table (docs/results/simulator.md)
    python -m benchmarks.sim_calibration --quick    # the rows CI checks

The constants it checks stay here, as code (``fastps.sim.cluster``, ``fastps.sim.pushpull``).
This module only says so, for anyone running the old command.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

NEW_COMMAND = "python -m benchmarks.sim_calibration"
MESSAGE = (
    "fastps.sim.calibration: the calibration harness moved out of the package (it reads "
    "the measurements stored in the fastps source tree); from the root of a fastps "
    f"checkout run: {NEW_COMMAND} [--quick]"
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    print(MESSAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
