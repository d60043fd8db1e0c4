"""The machines of a SLURM allocation, from the variables ``sbatch``/``salloc`` set.

``SLURM_JOB_NODELIST`` is a compressed host list (``node[01-03,07],gpu-a[1-2]``);
``SLURM_TASKS_PER_NODE`` says how many tasks each node takes in order (``2(x3),1``: two on
each of the first three nodes, one on the fourth), ``SLURM_NTASKS_PER_NODE`` one count for
every node. Those tasks are the worker slots; the processes are started with ``srun`` by
``remote.SrunTransport``. In elastic mode the allocation is the discovery
(:func:`allocation_hosts`), and any other discovery's hosts must be its nodes
(:func:`check_in_allocation`): a step can only start on a node of the job.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Mapping

from fastps.errors import FastPSError
from fastps.launch.hosts import HostSlots

__all__ = [
    "expand_nodelist",
    "expand_tasks_per_node",
    "allocation_from_env",
    "allocation_hosts",
    "check_in_allocation",
]

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top(text: str) -> List[str]:
    """Splits on commas outside brackets."""
    parts: List[str] = []
    cur: List[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise FastPSError(f"SLURM node list {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise FastPSError(f"SLURM node list {text!r}: unbalanced '['")
    parts.append("".join(cur))
    return parts


def _expand_one(item: str, whole: str) -> List[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    head, body, tail = item[:start], item[start + 1 : end], item[end + 1 :]
    out: List[str] = []
    for rng in body.split(","):
        m = _RANGE_RE.match(rng.strip())
        if m is None:
            raise FastPSError(f"SLURM node list {whole!r}: bad range {rng!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise FastPSError(f"SLURM node list {whole!r}: range {rng!r} runs backwards")
        width = len(lo)  # node[01-10] keeps the leading zeros
        for n in range(int(lo), int(hi) + 1):
            for rest in _expand_one(tail, whole):
                out.append(f"{head}{n:0{width}d}{rest}")
    return out


def expand_nodelist(text: str) -> List[str]:
    """``node[01-03,07],login`` -> [node01, node02, node03, node07, login]."""
    text = text.strip()
    if not text:
        raise FastPSError("SLURM node list is empty")
    nodes: List[str] = []
    for item in _split_top(text):
        item = item.strip()
        if not item:
            raise FastPSError(f"SLURM node list {text!r}: empty entry")
        nodes += _expand_one(item, text)
    return nodes


def expand_tasks_per_node(text: str, var: str = "SLURM_TASKS_PER_NODE") -> List[int]:
    """``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for item in text.split(","):
        m = _COUNT_RE.match(item.strip())
        if m is None:
            raise FastPSError(f"{var}={text!r}: {item!r} is not N or N(xM)")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def allocation_from_env(env: Mapping[str, str]) -> List[HostSlots]:
    """The allocation's nodes with their task counts as worker slots."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise FastPSError("--slurm: SLURM_JOB_NODELIST is not set (not inside an allocation?)")
    nodes = expand_nodelist(nodelist)
    if env.get("SLURM_TASKS_PER_NODE"):
        counts = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
    elif env.get("SLURM_NTASKS_PER_NODE"):
        counts = expand_tasks_per_node(env["SLURM_NTASKS_PER_NODE"], "SLURM_NTASKS_PER_NODE")
        if len(counts) == 1:
            counts = counts * len(nodes)
    else:
        counts = [1] * len(nodes)
    if len(counts) != len(nodes):
        raise FastPSError(
            f"SLURM allocation: {len(nodes)} nodes ({nodelist}) but task counts for {len(counts)}"
        )
    return [HostSlots(n, c) for n, c in zip(nodes, counts) if c > 0]


def allocation_hosts(env: Mapping[str, str]) -> Dict[str, int]:
    """``{node: task slots}`` of the allocation, in node-list order (elastic mode's fixed
    discovery under ``--slurm``)."""
    hosts: Dict[str, int] = {}
    for h in allocation_from_env(env):
        hosts[h.name] = hosts.get(h.name, 0) + h.slots
    return hosts


def check_in_allocation(
    hosts: Iterable[str], nodes: Iterable[str], source: str, job_id: str = ""
) -> None:
    """Raises an error naming every host of ``hosts`` (from ``source``: "-H", "the host
    discovery script", ...) that is not one of the allocation's ``nodes``."""
    known = list(nodes)
    outside = [h for h in hosts if h not in known]
    if not outside:
        return
    names = ", ".join(repr(h) for h in outside)
    job = f"job {job_id}: " if job_id else ""
    plural = "s" if len(outside) > 1 else ""
    raise FastPSError(
        f"host{plural} {names} from {source} {'are' if plural else 'is'} not in the SLURM "
        f"allocation ({job}nodes {', '.join(known)}): under --slurm workers start as srun steps "
        "on the allocation's nodes only"
    )
