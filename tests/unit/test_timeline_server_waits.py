"""The timeline summary's per-server wait for the last worker's push (core/timeline/summarize.py)
on a hand-made trace; the whole timeline with real processes: tests/integration/test_timeline.py."""

from __future__ import annotations

from typing import Any, Dict, List

from fastps.timeline import summarize


def _trace(waits_us: Dict[int, List[float]]) -> Dict[str, Any]:
    events: List[Dict[str, Any]] = []
    for sid, durs in waits_us.items():
        pid = 1001 + sid
        host = "c0" if sid == 1 else "w0"
        events.append(
            {
                "ph": "M",
                "pid": pid,
                "name": "process_name",
                "args": {"name": f"server {sid} ({host})"},
            }
        )
        for i, d in enumerate(durs):
            args = {"tensor": "t", "part": i, "round": 0}
            events.append(
                {"ph": "X", "pid": pid, "tid": i, "name": "wait for workers", "cat": "stage",
                 "ts": 100.0 * i, "dur": d, "args": args}
            )  # fmt: skip
            events.append(
                {"ph": "X", "pid": pid, "tid": i, "name": "sum", "cat": "sum",
                 "ts": 100.0 * i + d, "dur": 5.0, "args": args}
            )  # fmt: skip
    return {"traceEvents": events}


def test_each_server_gets_its_median_p90_and_worst_wait() -> None:
    tl = summarize.load(_trace({0: [1000.0] * 9 + [50_000.0], 1: [10.0, 20.0, 30.0]}))
    waits = summarize.server_waits(tl)
    assert [w[0] for w in waits] == ["server 0", "server 1"]
    _, n, med, p90, worst = waits[0]
    assert (n, med, p90, worst) == (10, 1000.0, 50_000.0, 50_000.0)
    assert waits[1][1:] == (3, 20.0, 30.0, 30.0)
    text = summarize.report(tl)
    assert "waited for the last worker's push" in text
    assert "server 1 (c0)" in text and "max     0.03 ms" in text


def test_a_trace_without_server_stages_has_no_wait_section() -> None:
    tl = summarize.load({"traceEvents": []})
    assert summarize.server_waits(tl) == []
    assert "waited for the last worker's push" not in summarize.report(tl)
