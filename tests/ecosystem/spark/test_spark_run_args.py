"""fastps.spark.run's Horovod arguments with a meaning of their own on a real Spark
(local[2]): ``stdout``/``stderr`` get each rank's output prefixed ``[rank]<stdout>:``, and
a stage that does not fit the cluster's task slots fails after ``start_timeout``."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pytest


def test_stdout_and_stderr_get_each_ranks_lines(spark: Any) -> None:
    import fastps.spark

    def fn(word: str) -> int:  # pickled by value: nothing of this module in the task
        import sys

        import fastps.torch as hvd
        import torch

        hvd.init()
        total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
        print(f"{word} {hvd.size()} {float(total[0]):g}")
        print("first", "line", end="")
        print(" and its end")
        print(f"error of {hvd.rank()}", file=sys.stderr)
        return hvd.rank()

    out, err = io.StringIO(), io.StringIO()
    assert fastps.spark.run(fn, args=("hello",), num_proc=2, stdout=out, stderr=err) == [0, 1]
    assert out.getvalue() == (
        "[0]<stdout>:hello 2 2\n[0]<stdout>:first line and its end\n"
        "[1]<stdout>:hello 2 2\n[1]<stdout>:first line and its end\n"
    )
    assert err.getvalue() == "[0]<stderr>:error of 0\n[1]<stderr>:error of 1\n"

    # Only the streams asked for; with prefix_output_with_timestamp each line has its time.
    err = io.StringIO()
    fastps.spark.run(fn, args=("again",), num_proc=2, stderr=err, prefix_output_with_timestamp=True)
    lines = err.getvalue().splitlines()
    assert len(lines) == 2, lines
    for rank, line in enumerate(lines):
        stamp, _, rest = line.partition(f" [{rank}]<stderr>:")
        assert rest == f"error of {rank}", line
        assert abs(time.mktime(time.strptime(stamp, "%a %b %d %H:%M:%S %Y")) - time.time()) < 600


def test_a_stage_larger_than_the_cluster_times_out_at_start_timeout(spark: Any) -> None:
    import fastps.spark
    from fastps.errors import FastPSError

    began = time.monotonic()
    message = (
        re.escape("Timed out waiting for Spark tasks to start") + r".*num_proc=3.* 2 task slots"
    )
    with pytest.raises(FastPSError, match=message):
        fastps.spark.run(print, num_proc=3, start_timeout=2)
    assert 2 <= time.monotonic() - began < 30  # Spark alone would hold it 40 x 15 s
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []

    def rank() -> int:
        import fastps.torch as hvd

        hvd.init()
        return hvd.rank()

    assert fastps.spark.run(rank, num_proc=2) == [0, 1]  # the session still runs jobs
