"""Joins the processes' shares of a timeline into one Chrome trace / Perfetto JSON file.

Each share (``recorder.py``) holds raw marks in its own clock; here they are moved onto
the scheduler's clock (the offset measured at start) and turned into spans:

* a **worker** track shows, per part and round, a parent span ``tensor[part]`` whose
  children are the part's stages in order: queued, local reduce, queued for push, push
  (handed to the socket until its last byte left), at server, answer (the sum arriving),
  copy out; a part another local worker owns shows queued and "at local owner".
* a **server** track shows, per part and round, ``tensor[part]`` with receive, wait for
  workers (with the sums of earlier arrivals nested in it) and answer (with the final
  sum of shared-memory parts nested in it); its args say when each worker's copy came.
* counters: the bytes each worker has pushed to each server and not yet had answered.
* framework events of the plugins (gradient ready, optimizer applied, forward waited).

Concurrent parts go to separate rows ("lanes") of a track, so spans on one row never
overlap and children always nest inside their parent.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from . import events as ev
from .recorder import parts_dir

# Stage names by the marks that open and close them (worker side).
WORKER_STAGES: Dict[Tuple[int, int], str] = {
    (ev.ENQUEUE, ev.SEND): "queued",
    (ev.ENQUEUE, ev.LOCAL_BEGIN): "queued",
    (ev.ENQUEUE, ev.CONTRIBUTE): "queued",
    (ev.LOCAL_BEGIN, ev.LOCAL_END): "local reduce",
    (ev.LOCAL_END, ev.SEND): "queued for push",
    (ev.LOCAL_END, ev.DONE): "copy out",
    (ev.SEND, ev.WRITTEN): "push",
    (ev.WRITTEN, ev.RESULT_HEADER): "at server",
    (ev.RESULT_HEADER, ev.RESULT): "answer",
    (ev.RESULT, ev.DONE): "copy out",
    (ev.CONTRIBUTE, ev.DONE): "at local owner",
}
# The order of a worker's marks within one round of a part.
_WORKER_ORDER = [
    ev.ENQUEUE,
    ev.LOCAL_BEGIN,
    ev.LOCAL_END,
    ev.CONTRIBUTE,
    ev.SEND,
    ev.WRITTEN,
    ev.RESULT_HEADER,
    ev.RESULT,
    ev.DONE,
]
_RANK = {m: i for i, m in enumerate(_WORKER_ORDER)}

WORKER_PID_BASE = 1
SERVER_PID_BASE = 1001
LANE_TID_BASE = 100  # rows of parts; framework threads use tids below


def load_shares(path: str) -> List[Dict[str, Any]]:
    """Every process's share of the trace at ``path`` (from ``<path>.parts/``)."""
    files = sorted(glob.glob(os.path.join(parts_dir(path), "*.json")))
    shares = []
    for f in files:
        with open(f) as fh:
            shares.append(json.load(fh))
    return shares


def _us(ns: int, origin: int) -> float:
    return round((ns - origin) / 1000.0, 3)


class _Lanes:
    """Assigns spans to rows so that spans on one row never overlap."""

    def __init__(self) -> None:
        self.ends: List[int] = []

    def place(self, start: int, end: int) -> int:
        for i, e in enumerate(self.ends):
            if e <= start:
                self.ends[i] = end
                return i
        self.ends.append(end)
        return len(self.ends) - 1


def _rounds_by_part(events: List[List[int]], marks: frozenset) -> Dict[Tuple[int, int], list]:
    by_part: Dict[Tuple[int, int], list] = {}
    for e in events:
        if e[4] in marks:
            by_part.setdefault((e[1], e[2]), []).append(e)
    for lst in by_part.values():
        lst.sort(key=lambda e: e[0])
    return by_part


_LOOKBACK = 4


def _owning_round(
    rounds: List[Dict[int, Tuple[int, int, int]]], mark: int
) -> Dict[int, Tuple[int, int, int]]:
    """The round a (non-enqueue) mark belongs to.

    Every mark but 'written' is stamped before the part is handed on, so it belongs to the
    latest round. 'written' is stamped by the writer thread after its last byte; descheduled
    there, it can stamp after the answer and even after the next round's enqueue and send.
    A part's writes go out in round order, so it belongs to the oldest recent round that
    sent and has no 'written' yet (only a few rounds back: a round left incomplete by
    dropped events must not collect much later marks).
    """
    if mark == ev.WRITTEN:
        for r in rounds[-_LOOKBACK:]:
            if ev.SEND in r and ev.WRITTEN not in r:
                return r
    return rounds[-1]


def _worker_rounds(events: List[List[int]]) -> Tuple[List[Dict[str, Any]], int]:
    """Complete rounds of every part: {tensor, part, round, marks: {mark: (ts, peer, bytes)}}."""
    out = []
    incomplete = 0
    for (tensor, part), lst in _rounds_by_part(events, ev.WORKER_MARKS).items():
        rounds: List[Dict[int, Tuple[int, int, int]]] = []
        for e in lst:
            ts, _, _, nbytes, mark, peer, _ = e
            if mark == ev.ENQUEUE or not rounds:
                rounds.append({})
            _owning_round(rounds, mark).setdefault(mark, (ts, peer, nbytes))
        for k, marks in enumerate(rounds):
            if ev.ENQUEUE not in marks or ev.DONE not in marks:
                incomplete += 1
                continue
            out.append({"tensor": tensor, "part": part, "round": k, "marks": marks})
    return out, incomplete


def _new_server_round() -> Dict[str, Any]:
    return {"headers": [], "received": [], "sums": [], "all_in": None, "answers": []}


def _server_rounds(events: List[List[int]]) -> Tuple[List[Dict[str, Any]], int]:
    out = []
    incomplete = 0
    for (tensor, part), lst in _rounds_by_part(events, ev.SERVER_MARKS).items():
        rounds: List[Dict[str, Any]] = []
        open_sum: Dict[int, int] = {}
        for e in lst:
            ts, _, _, nbytes, mark, peer, _ = e
            if mark in (ev.PUSH_HEADER, ev.PUSH_RECEIVED):
                if not rounds or rounds[-1]["all_in"] is not None:
                    rounds.append(_new_server_round())
                cur = rounds[-1]
                cur["headers" if mark == ev.PUSH_HEADER else "received"].append((ts, peer))
                cur["bytes"] = nbytes
            elif mark == ev.SUM_BEGIN:
                open_sum[peer] = ts
            elif mark == ev.SUM_END and rounds:
                start = open_sum.pop(peer, ts)
                rounds[-1]["sums"].append((start, ts, peer))
            elif mark == ev.ALL_IN and rounds and rounds[-1]["all_in"] is None:
                rounds[-1]["all_in"] = ts
            elif mark == ev.ANSWER_WRITTEN:
                for r in reversed(rounds):
                    if r["all_in"] is not None:
                        r["answers"].append((ts, peer))
                        break
        for k, r in enumerate(rounds):
            if r["all_in"] is None or not r["received"] or not r["answers"]:
                incomplete += 1
                continue
            r.update(tensor=tensor, part=part, round=k)
            out.append(r)
    return out, incomplete


class _Builder:
    def __init__(self, origin: int) -> None:
        self.origin = origin
        self.trace: List[Dict[str, Any]] = []

    def meta(self, pid: int, name: str, sort: int) -> None:
        self.trace.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
        self.trace.append(
            {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": sort}}
        )

    def thread(self, pid: int, tid: int, name: str) -> None:
        self.trace.append(
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )
        self.trace.append(
            {
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
        )

    def span(
        self, pid: int, tid: int, name: str, cat: str, a: int, b: int, args: Dict[str, Any]
    ) -> None:
        ts = _us(a, self.origin)
        self.trace.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "name": name,
                "cat": cat,
                "ts": ts,
                "dur": round(max(_us(b, self.origin) - ts, 0.0), 3),
                "args": args,
            }
        )


def _tensor_name(names: Dict[int, str], tensor: int) -> str:
    return names.get(tensor, f"tensor {tensor:#x}")


def _emit_worker(b: _Builder, share: Dict[str, Any], shift: int, names: Dict[int, str]) -> int:
    pid = WORKER_PID_BASE + int(share["rank"])
    b.meta(pid, f"worker {share['rank']} ({share['host']}, pid {share['pid']})", pid)
    rounds, incomplete = _worker_rounds(share["events"])
    lanes = _Lanes()
    used = set()
    inflight: Dict[int, List[Tuple[int, int]]] = {}
    rounds.sort(key=lambda r: r["marks"][ev.ENQUEUE][0])
    for r in rounds:
        marks = sorted(r["marks"].items(), key=lambda kv: _RANK[kv[0]])
        # One clock per process, but marks of one round come from several threads: keep
        # them in their causal order even where two threads' reads straddle each other.
        points: List[Tuple[int, int]] = []
        for m, (ts, _, _) in marks:
            t = ts + shift
            if points and t < points[-1][1]:
                t = points[-1][1]
            points.append((m, t))
        start, end = points[0][1], points[-1][1]
        lane = lanes.place(start, end)
        tid = LANE_TID_BASE + lane
        used.add(tid)
        name = _tensor_name(names, r["tensor"])
        nbytes = r["marks"][ev.ENQUEUE][2]
        server = r["marks"].get(ev.SEND, (0, -1, 0))[1]
        args = {"tensor": name, "part": r["part"], "round": r["round"], "bytes": nbytes}
        if ev.SEND in r["marks"]:
            args["server"] = server
            inflight.setdefault(server, []).append((points[_index(points, ev.SEND)][1], nbytes))
            if ev.RESULT in r["marks"]:
                inflight[server].append((points[_index(points, ev.RESULT)][1], -nbytes))
        b.span(pid, tid, f"{name}[{r['part']}]", "part", start, end, args)
        for (m0, t0), (m1, t1) in zip(points, points[1:]):
            stage = WORKER_STAGES.get((m0, m1), f"mark {m0}->{m1}")
            b.span(
                pid,
                tid,
                stage,
                "stage",
                t0,
                t1,
                {"tensor": name, "part": r["part"], "round": r["round"]},
            )
    for tid in sorted(used):
        b.thread(pid, tid, f"parts {tid - LANE_TID_BASE}")
    for server, deltas in sorted(inflight.items()):
        level = 0
        for t, d in sorted(deltas):
            level += d
            b.trace.append(
                {
                    "ph": "C",
                    "pid": pid,
                    "name": f"bytes in flight to server {server}",
                    "ts": _us(t, b.origin),
                    "args": {"bytes": level},
                }
            )
    _emit_framework(b, share, pid, shift)
    return incomplete


def _index(points: List[Tuple[int, int]], mark: int) -> int:
    return next(i for i, (m, _) in enumerate(points) if m == mark)


def _emit_framework(b: _Builder, share: Dict[str, Any], pid: int, shift: int) -> None:
    threads = share.get("threads", {})
    tids: Dict[int, int] = {}
    for start, dur, kind, label, thread in share.get("framework", []):
        if thread not in tids:
            tids[thread] = 1 + len(tids)
            b.thread(pid, tids[thread], f"python: {threads.get(str(thread), thread)}")
        t = start + shift
        if dur > 0:
            b.span(pid, tids[thread], kind, "framework", t, t + dur, {"tensor": label})
        else:
            b.trace.append(
                {
                    "ph": "i",
                    "s": "t",
                    "pid": pid,
                    "tid": tids[thread],
                    "name": kind,
                    "cat": "framework",
                    "ts": _us(t, b.origin),
                    "args": {"tensor": label},
                }
            )


def _emit_server(b: _Builder, share: Dict[str, Any], shift: int, names: Dict[int, str]) -> int:
    pid = SERVER_PID_BASE + int(share["rank"])
    b.meta(pid, f"server {share['rank']} ({share['host']}, pid {share['pid']})", pid)
    rounds, incomplete = _server_rounds(share["events"])
    lanes = _Lanes()
    used = set()
    rounds.sort(key=lambda r: min(t for t, _ in r["headers"] or r["received"]))
    for r in rounds:
        first_hdr = min(t for t, _ in (r["headers"] or r["received"])) + shift
        first_rcv = max(min(t for t, _ in r["received"]) + shift, first_hdr)
        all_in = max(r["all_in"] + shift, first_rcv)
        last_ans = max([t + shift for t, _ in r["answers"]] + [all_in])
        sums = [(max(a + shift, first_rcv), b_ + shift, p) for a, b_, p in r["sums"]]
        end = max([last_ans] + [s[1] for s in sums])
        lane = lanes.place(first_hdr, end)
        tid = LANE_TID_BASE + lane
        used.add(tid)
        name = _tensor_name(names, r["tensor"])
        ident = {"tensor": name, "part": r["part"], "round": r["round"]}
        arrivals = {f"worker {p}": _us(t + shift, b.origin) for t, p in sorted(r["received"])}
        last = max(r["received"])[1]
        args = dict(ident, bytes=r.get("bytes", 0), arrivals_us=arrivals, last_worker=last)
        b.span(pid, tid, f"{name}[{r['part']}]", "part", first_hdr, end, args)
        b.span(pid, tid, "receive", "stage", first_hdr, first_rcv, dict(ident))
        b.span(
            pid, tid, "wait for workers", "stage", first_rcv, all_in, dict(ident, last_worker=last)
        )
        b.span(pid, tid, "answer", "stage", all_in, end, dict(ident))
        for a, z, p in sums:
            # A sum nests in the stage it ran in: earlier arrivals while waiting, the
            # final (shared-memory) sum while answering.
            if z <= all_in:
                b.span(pid, tid, "sum", "sum", a, z, dict(ident, worker=p))
            else:
                b.span(pid, tid, "sum", "sum", max(a, all_in), z, dict(ident, worker=p))
    for tid in sorted(used):
        b.thread(pid, tid, f"parts {tid - LANE_TID_BASE}")
    return incomplete


def merge(shares: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The Chrome trace (JSON object format) of these shares."""
    if not shares:
        raise ValueError("no timeline shares to merge")
    names: Dict[int, str] = {}
    for s in shares:
        names.update({int(k): v for k, v in s.get("names", {}).items()})
    # The scheduler's clock = a process's clock + its offset.
    firsts = []
    for s in shares:
        ts = [e[0] for e in s["events"]] + [f[0] for f in s.get("framework", [])]
        if ts:
            firsts.append(min(ts) + int(s["offset_ns"]))
    origin = min(firsts) if firsts else 0
    b = _Builder(origin)
    incomplete = 0
    order = sorted(shares, key=lambda s: (s["role"] != "worker", int(s["rank"])))
    for s in order:
        shift = int(s["offset_ns"])
        if s["role"] == "worker":
            incomplete += _emit_worker(b, s, shift, names)
        else:
            incomplete += _emit_server(b, s, shift, names)
    clock = {
        f"{s['role']} {s['rank']}": {
            "offset_ns": s["offset_ns"],
            "rtt_ns": s["rtt_ns"],
            "host": s["host"],
        }
        for s in shares
    }
    return {
        "traceEvents": b.trace,
        "displayTimeUnit": "ms",
        "otherData": {
            "fastps": {
                "origin_ns": origin,
                "clock": clock,
                # NTP's bound: each offset is off by at most half its round trip.
                "max_clock_error_us": max(s["rtt_ns"] for s in shares) / 2000.0,
                "dropped_events": sum(int(s.get("dropped", 0)) for s in shares),
                "incomplete_rounds": incomplete,
                "link_mbit": {f"{s['role']} {s['rank']}": s.get("link_mbit") for s in shares},
            }
        },
    }


def merge_files(path: str, remove_parts: bool = True) -> Optional[Dict[str, Any]]:
    """Merges ``<path>.parts/*.json`` into ``path``; returns the trace's summary data."""
    shares = load_shares(path)
    if not shares:
        return None
    trace = merge(shares)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    os.replace(tmp, path)
    if remove_parts:
        folder = parts_dir(path)
        for share in glob.glob(os.path.join(folder, "*.json")):
            os.remove(share)
        try:
            os.rmdir(folder)
        except OSError:
            pass
    info = trace["otherData"]["fastps"]
    info["processes"] = len(shares)
    return info
