"""Splits a fastpsrun job's output (``[worker R] line``) into each worker's lines, for the
plugins' quorum tests (tests/tensorflow, tests/mxnet) that check them with
quorum_worker.check_job."""

from __future__ import annotations

import re
from typing import Dict

_LINE = re.compile(r"^\[worker (\d+)\] ?(.*)$")


def by_worker(output: str) -> Dict[int, str]:
    lines: Dict[int, list] = {}
    for line in output.splitlines():
        m = _LINE.match(line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return {r: "\n".join(v) for r, v in lines.items()}
