"""The timeline's merge (core/timeline/merge.py) on recorded events, without a job: each mark
stays with its round. The whole timeline with real processes: tests/integration/test_timeline.py."""

from __future__ import annotations

from typing import List

from fastps.timeline import events as ev
from fastps.timeline.merge import _worker_rounds


def test_a_written_mark_stamped_after_the_next_round_stays_with_its_round() -> None:
    """The writer thread stamps 'written' after its last byte; descheduled there (CI load),
    the stamp can fall after the answer and after the next round's enqueue and send."""

    def e(ts: int, mark: int) -> List[int]:
        return [ts, 7, 0, 64, mark, 1, 0]

    events = [
        e(10, ev.ENQUEUE), e(11, ev.SEND), e(13, ev.RESULT_HEADER), e(14, ev.RESULT),
        e(15, ev.DONE), e(16, ev.ENQUEUE), e(17, ev.SEND),
        e(18, ev.WRITTEN),  # round 0's, late
        e(19, ev.WRITTEN), e(20, ev.RESULT_HEADER), e(21, ev.RESULT), e(22, ev.DONE),
    ]  # fmt: skip
    rounds, incomplete = _worker_rounds(events)
    assert incomplete == 0
    assert [r["marks"][ev.WRITTEN][0] for r in rounds] == [18, 19]
    assert [sorted(r["marks"]) for r in rounds] == [sorted(ev.WORKER_MARKS - {7, 8, 9})] * 2
