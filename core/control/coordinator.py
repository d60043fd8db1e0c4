"""The scheduler's side of collective coordination: gather one small record from every
member of a process set, then give every member all of them.

Every collective of ``core/collectives/ops.py`` first announces itself (kind, dtype, shape,
root, splits...) under its name; once every member of its process set has announced the
same name, each member receives every member's record and checks them with the same
function, so a mismatch raises on every rank with both values named, and nothing else in
the job is affected. The coordinator itself only gathers: it never judges the records.

Join: a rank that called ``join`` counts as present in every later gather of its set (its
record is ``None``, so the others know it stands in with zeros) until every member joined;
the join gather then completes with the rank that joined last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

JOIN = "__join__"

Key = Tuple[int, str]  # (process set id, op name)


@dataclass
class _Gather:
    ranks: List[int]
    records: Dict[int, Any] = field(default_factory=dict)


@dataclass
class Completed:
    """A finished gather: send ``message`` to each rank of ``ranks``."""

    ranks: List[int]
    message: Dict[str, Any]


class Coordinator:
    """Pure bookkeeping (no sockets), driven by the scheduler's event loop."""

    def __init__(self) -> None:
        self._gathers: Dict[Key, _Gather] = {}
        self._joined: Dict[int, List[int]] = {}  # set id -> ranks in join, in arrival order

    def announce(
        self, set_id: int, ranks: Sequence[int], name: str, rank: int, record: Any
    ) -> Tuple[List[Completed], Optional[str]]:
        """Adds ``rank``'s record for ``name``. Returns the gathers this completed and an
        error for the sender alone (then nothing was added)."""
        members = sorted(int(r) for r in ranks)
        if rank not in members:
            return [], (
                f"rank {rank} is not a member of process set {set_id} (ranks {members}) "
                f"and cannot take part in its op '{name}'"
            )
        key = (set_id, name)
        gather = self._gathers.get(key)
        if gather is None:
            gather = self._gathers[key] = _Gather(members)
        elif gather.ranks != members:
            return [], (
                f"op '{name}' of process set {set_id}: rank {rank} knows the set as ranks "
                f"{members}, rank {next(iter(gather.records))} as ranks {gather.ranks}"
            )
        if rank in gather.records:
            return [], f"rank {rank} announced op '{name}' twice while it was in flight"
        gather.records[rank] = record
        if name == JOIN:
            self._joined.setdefault(set_id, []).append(rank)
            return self._complete_all(set_id), None
        return self._complete([key]), None

    def withdraw(self, set_id: int, name: str, rank: int) -> None:
        """``rank`` stopped waiting for ``name``: its record goes (a join leaves the set's
        joined ranks), so announcing the name again starts afresh."""
        gather = self._gathers.get((set_id, name))
        if gather is not None:
            gather.records.pop(rank, None)
            if not gather.records:
                del self._gathers[(set_id, name)]
        if name == JOIN and rank in self._joined.get(set_id, []):
            self._joined[set_id].remove(rank)

    def waits(self) -> List[Tuple[int, str, List[int], List[int]]]:
        """Every open gather, for the stall inspector (core/worker/stall.py): (set id, op name,
        the ranks that announced it and wait, the members it still lacks; a rank in join
        lacks only the join)."""
        out = []
        for (set_id, name), gather in self._gathers.items():
            joined = self._joined.get(set_id, []) if name != JOIN else []
            lacking = [r for r in gather.ranks if r not in gather.records and r not in joined]
            out.append((set_id, name, sorted(gather.records), lacking))
        return out

    def forget_set(self, set_id: int) -> None:
        """A removed process set: its pending gathers can never complete."""
        for key in [k for k in self._gathers if k[0] == set_id]:
            del self._gathers[key]
        self._joined.pop(set_id, None)

    def _complete_all(self, set_id: int) -> List[Completed]:
        # Non-join gathers first: ranks still working need them before the join ends.
        keys = sorted((k for k in self._gathers if k[0] == set_id), key=lambda k: k[1] == JOIN)
        return self._complete(keys)

    def _complete(self, keys: List[Key]) -> List[Completed]:
        done: List[Completed] = []
        for key in keys:
            gather = self._gathers.get(key)
            if gather is None:
                continue
            set_id, name = key
            joined = self._joined.get(set_id, [])
            if any(r not in gather.records and r not in joined for r in gather.ranks):
                continue
            del self._gathers[key]
            message: Dict[str, Any] = {
                "type": "coord_done",
                "set": set_id,
                "name": name,
                "records": [gather.records.get(r) for r in gather.ranks],
            }
            if name == JOIN:
                message["last"] = joined[-1]
                self._joined.pop(set_id, None)
            done.append(Completed(list(gather.ranks), message))
        return done
