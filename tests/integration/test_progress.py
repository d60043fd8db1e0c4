"""fastpsrun --progress with real processes: the status line (rich) reports iterations/s,
gradient GB/s, per-host rate and the slowest rank, and never cuts the prefixed output of
the processes, on a terminal (a pseudo-terminal, replayed by a small line emulator) and
when redirected."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import List

import pytest
from jobs import WORKERS

WORKER = os.path.join(WORKERS, "timeline_worker.py")
ROUND = re.compile(r"\[worker \d\] ROUND \d+ [\d.]+")
ROUNDS = 30


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    # Heartbeats carry the counters: 4 per second over a job of at least 30 x 0.1 s, so
    # the status line has several to show however fast the rounds run.
    env.update(
        ITERS=str(ROUNDS),
        SIZES="3000000,2000000",
        COLUMNS="200",
        PAUSE_S="0.1",
        FASTPS_HEARTBEAT_INTERVAL="0.25",
    )
    return env


def _screen(raw: str) -> List[str]:
    """The lines a terminal shows for ``raw``, for the sequences rich's Live uses on one
    row: carriage return, erase line (ESC[2K), styles and cursor visibility."""
    lines: List[str] = []
    cur: List[str] = []
    col = 0
    for tok in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]", raw):
        if tok == "\n":
            lines.append("".join(cur))
            cur, col = [], 0
        elif tok == "\r":
            col = 0
        elif tok == "\x1b[2K":
            cur = [" "] * len(cur)
        elif tok.startswith("\x1b"):
            continue
        else:
            if col < len(cur):
                cur[col] = tok
            else:
                cur.append(tok)
            col += 1
    lines.append("".join(cur))
    return [line.rstrip() for line in lines]


def _cmd() -> List[str]:
    return [
        sys.executable,
        "-m",
        "fastps.launcher",
        "--progress",
        "-np",
        "2",
        "--num-servers",
        "1",
        sys.executable,
        WORKER,
    ]


@pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) for a pty")
def test_status_line_on_a_terminal_leaves_every_output_line_whole() -> None:
    cmd = " ".join(_cmd())
    r = subprocess.run(
        ["script", "-q", "-e", "-c", cmd, "/dev/null"], env=_env(), capture_output=True, timeout=180
    )
    raw = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0, raw[-3000:]
    screen = _screen(raw)
    rounds = [line for line in screen if "ROUND" in line]
    assert len(rounds) == 2 * ROUNDS, rounds
    assert all(ROUND.fullmatch(line) for line in rounds), [
        line for line in rounds if not ROUND.fullmatch(line)
    ]
    status = [line for line in screen if "it/s" in line]
    assert status, screen[-5:]
    assert re.search(r"[\d.]+ it/s \| gradients [\d.]+ GB/s \| \S+ [\d.]+ GB/s", status[-1])
    assert "slowest rank" in status[-1]


def test_status_line_with_output_redirected() -> None:
    r = subprocess.run(_cmd(), env=_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    rounds = [line for line in r.stdout.splitlines() if "ROUND" in line]
    assert len(rounds) == 2 * ROUNDS and all(ROUND.fullmatch(x) for x in rounds)
    assert "it/s" in r.stderr and "it/s" not in r.stdout
