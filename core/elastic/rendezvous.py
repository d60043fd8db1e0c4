"""The worker's side of elastic rendezvous: which generation of the job to join.

An elastic job is a sequence of *generations*. Each is an ordinary fastps job (its own
scheduler, servers and job id ``<base>-g<k>``) over the workers alive when it formed;
worker processes outlive generations and keep their training state in memory. ``fastps.init``
in an elastic worker asks the driver (``fastps.elastic.driver``) for the next generation and
gets its rank, size and scheduler; ``shutdown`` + ``init`` moves to the next one.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional

from fastps import config
from fastps.config import Config
from fastps.control import elastic_wire as wire
from fastps.errors import FastPSError

log = logging.getLogger("fastps.elastic")

# The generation this process last joined (-1: none yet).
_generation = -1
_info: Dict[str, Any] = {}

# How long init waits for a generation beyond the driver's elastic timeout.
_MARGIN = 30.0
# A watch request: the driver answers within its WATCH_WAIT (20 s) even with no news.
WATCH_TIMEOUT = 30.0

# Called once when this process is told it is a spare (fastpsrun --spare-hosts): a plugin
# does the framework's lazy first-use work there (torch's first optimizer imports
# torch._dynamo: ~10 s on a loaded machine), not after it was given a failed rank.
_standby_hooks: List[Callable[[], None]] = []
_warmed = False

# Commits this process made (State.commit counts them): a worker whose host left the
# discovery output says after which one it stops.
_commits = 0


class Drained(FastPSError):
    """fastpsrun's answer to a worker whose host (or slot) left the discovery output: it
    committed and left its generation, the others go on without it; this process exits 0
    (``hvd.elastic.run`` turns this into ``SystemExit(0)``)."""

    def __init__(self, reason: str, commits: int) -> None:
        super().__init__(f"{reason}: this worker stops after commit {commits}")
        self.reason = reason
        self.commits = commits


def committed() -> None:
    """Counts a commit of this process (``State.commit``)."""
    global _commits
    _commits += 1


def commits() -> int:
    return _commits


# Whether the next join asks to stay in place (inplace.py): fastpsrun keeps the world's
# ranks and tells every member whether in-place replacement was granted.
_in_place = False


def ask_in_place(flag: bool) -> None:
    global _in_place
    _in_place = flag


def on_standby(hook: Callable[[], None]) -> None:
    if hook not in _standby_hooks:
        _standby_hooks.append(hook)


def _warm_up() -> None:
    global _warmed
    if _warmed:
        return
    _warmed = True
    for hook in _standby_hooks:
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - a warm-up is an optimisation only
            log.warning("spare warm-up %r failed: %s", hook, exc)


def generation() -> int:
    return _generation


def join() -> Config:
    """Waits (bounded by the elastic timeout) for the next generation and returns this
    worker's configuration in it. Also updates the Horovod/fastps variables of this process
    (``HOROVOD_RANK``...), so scripts that read them see the new world."""
    global _generation, _info
    me = config.elastic_id()
    while True:
        answer = wire.request(
            {
                "type": "rendezvous",
                "id": me,
                "after": _generation,
                "in_place": _in_place,
                "commits": _commits,
            },
            timeout=config.elastic_timeout() + _MARGIN,
            job_id=_base_job_id(),
        )
        # A spare (fastpsrun --spare-hosts) waits for a failed worker's place as long as
        # the job runs; each answer is bounded, and the driver stops it when the job ends.
        if answer.get("type") != "standby":
            break
        _warm_up()
    if answer.get("type") == "leave":
        raise Drained(str(answer.get("reason") or "this worker was removed"), _commits)
    if answer.get("type") != "assignment":
        raise FastPSError(f"elastic worker {me}: unexpected rendezvous answer {answer!r}")
    env = {
        "FASTPS_RANK": answer["rank"],
        "FASTPS_NUM_WORKERS": answer["size"],
        "FASTPS_NUM_SERVERS": answer["num_servers"],
        "FASTPS_SCHEDULER_ADDR": answer["scheduler"],
        "FASTPS_JOB_ID": answer["job_id"],
        "HOROVOD_RANK": answer["rank"],
        "HOROVOD_SIZE": answer["size"],
        "HOROVOD_LOCAL_RANK": answer["local_rank"],
        "HOROVOD_LOCAL_SIZE": answer["local_size"],
        "HOROVOD_CROSS_RANK": answer["cross_rank"],
        "HOROVOD_CROSS_SIZE": answer["cross_size"],
    }
    text = {k: str(v) for k, v in env.items()}
    cfg = Config.from_env({**os.environ, **text})
    os.environ.update(text)
    _generation = int(answer["generation"])
    _info = dict(answer)
    return cfg


def _base_job_id() -> str:
    """The elastic job's id (each generation has its own): it keys the driver's MAC."""
    return config.elastic_job_id()


def host_updates() -> Dict[str, Any]:
    """Asks the driver whether workers were added or removed since this generation formed:
    ``{"updated": bool, "removed_only": bool, "epoch": int}``."""
    return wire.request(
        {"type": "updates", "generation": _generation},
        timeout=30.0,
        job_id=_base_job_id(),
    )


def request(msg: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    return wire.request(msg, timeout=timeout, job_id=_base_job_id())


def assignment() -> Optional[Dict[str, Any]]:
    """The driver's last answer (rank, size, generation...), None before the first."""
    return dict(_info) if _info else None
