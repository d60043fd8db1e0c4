"""A fastpsrun job the test acts on while it runs: its output read line by line, waits
for a line (bounded), the pids fastpsrun announces for worker slots and for each
generation's servers, and a discovery script whose output the test changes."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple


def discovery_script(tmp_path: Path, text: str) -> tuple[Path, Path]:
    """A discovery script printing the file ``hosts`` (``text``, ';' for newlines)."""
    hosts = tmp_path / "hosts"
    hosts.write_text(text.replace(";", "\n") + "\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return hosts, script


class LiveJob:
    def __init__(
        self,
        args: Sequence[str],
        env: Dict[str, str],
        cwd: Optional[Path] = None,
        python: str = sys.executable,
    ):
        """``python`` runs fastpsrun (another environment's interpreter, e.g. one with
        torchvision)."""
        cmd = [python, "-m", "fastps.launcher", *args]
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.lines: List[str] = []
        self.times: List[float] = []  # when each line arrived (time.time())
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self.times.append(time.time())
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    @property
    def output(self) -> str:
        with self._cv:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> re.Match:
        """The first line from ``start`` on matching ``pattern``; fails after ``timeout`` s
        or when the job ended without it."""
        return self.wait_for_line(pattern, timeout, start)[1]

    def wait_for_line(self, pattern: str, timeout: float, start: int = 0) -> Tuple[int, re.Match]:
        """Like ``wait_for``, with the line's index (``times[index]``: when it arrived)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for i in range(start, len(self.lines)):
                    m = rx.search(self.lines[i])
                    if m:
                        return i, m
                ended = self.proc.poll() is not None and not self._reader.is_alive()
                left = deadline - time.monotonic()
                if ended or left <= 0:
                    why = "the job ended" if ended else f"{timeout:g} s passed"
                    raise AssertionError(f"no line matching {pattern!r} ({why}):\n{self.tail()}")
                self._cv.wait(min(left, 0.5))

    def mark(self) -> int:
        """The number of lines so far: a ``start`` for ``wait_for``."""
        with self._cv:
            return len(self.lines)

    def worker_pid(self, slot: str) -> int:
        m = self.wait_for(rf"worker \d+ started on slot {re.escape(slot)} \(pid (\d+)\)", 60)
        return int(m.group(1))

    def server_pids(self, generation: int) -> Dict[int, int]:
        """Server id -> pid of a generation's servers started by fastpsrun."""
        m = self.wait_for(rf"generation {generation}: servers (.*)", 60)
        return {int(i): int(p) for i, p in re.findall(r"(\d+) \(pid (\d+)\)", m.group(1))}

    def finish(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the job did not end in {timeout:g} s:\n{self.tail()}") from None
        self._reader.join(timeout=10)
        return rc

    def stop(self) -> None:
        """Ends the job and everything it started (its own process group and the children's
        groups: fastpsrun gives each child a group and stops them on SIGTERM)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def tail(self, n: int = 8000) -> str:
        return self.output[-n:]
