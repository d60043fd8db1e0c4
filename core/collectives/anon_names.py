"""Numbering of anonymous collectives, which must stay in step across ranks.

An op without a name is called ``noname.N`` (a barrier ``barrier.N``), N counting this
rank's anonymous ops in call order: ranks that call the same ops get the same names. A
number is used on every rank once the op coordinated (all members announced it), even
when the op then fails. An op whose wait was cut short before it coordinated (its op
timeout, a test's timeout, Ctrl-C) withdraws its announcement, and its number was used on
this rank only: the ranks that never reached that op did not count it. If this rank kept
counting past it, every later anonymous op would wait for a name no other rank uses, and
all of them would time out, one after another. So the withdrawn number is given back and
the next anonymous op takes it again, as it does on the ranks that never got there.

Numbers are given back from the top only: N is reused once every later number was given
back too, no op numbered N is still running, and none coordinated (the parts of a grouped
op, ``noname.N.0``, ``noname.N.1``, ... share N; so do an object broadcast's ``.size``
and ``.data``).
"""

from __future__ import annotations

import re
import threading
from typing import Dict, Optional, Set, Tuple

_NUMBERED = re.compile(r"^(noname|barrier)\.(\d+)(?:\.|$)")


def number_of(name: str) -> Optional[Tuple[str, int]]:
    """``("noname", 12)`` for ``noname.12`` and ``noname.12.3``; None for a named op."""
    m = _NUMBERED.match(name)
    return (m.group(1), int(m.group(2))) if m else None


class Numbering:
    """One counter (per process set, and per kind: ops or barriers)."""

    def __init__(self, start: int = 0) -> None:
        self._lock = threading.Lock()
        self._next = start
        self._floor = 0  # numbers below it coordinated (or were skipped): never reused
        self._running: Dict[int, int] = {}  # number -> ops with it not finished yet
        self._withdrawn: Set[int] = set()

    def take(self) -> int:
        with self._lock:
            n = self._next
            self._next += 1
            return n

    def peek(self) -> int:
        """The number the next anonymous op gets."""
        with self._lock:
            return self._next

    def skip_past(self, number: int) -> None:
        """Every number up to ``number`` is used (a joined rank stood in for it)."""
        with self._lock:
            self._next = max(self._next, number + 1)
            self._floor = max(self._floor, number + 1)

    def started(self, number: int) -> None:
        with self._lock:
            self._running[number] = self._running.get(number, 0) + 1

    def finished(self, number: int, withdrawn: bool) -> None:
        """An op numbered ``number`` ended: coordinated (its number is used everywhere),
        or withdrawn before it coordinated."""
        with self._lock:
            left = self._running.get(number, 1) - 1
            if left > 0:
                self._running[number] = left
            else:
                self._running.pop(number, None)
            if withdrawn:
                self._withdrawn.add(number)
            else:
                self._floor = max(self._floor, number + 1)
            self._give_back()

    def _give_back(self) -> None:
        while (
            self._next - 1 >= self._floor
            and self._next - 1 in self._withdrawn
            and self._next - 1 not in self._running
        ):
            self._withdrawn.discard(self._next - 1)
            self._next -= 1
        if self._withdrawn:  # below the floor they can never be reused
            self._withdrawn = {n for n in self._withdrawn if n >= self._floor}
