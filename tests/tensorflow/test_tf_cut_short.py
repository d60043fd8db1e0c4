"""An anonymous op one rank ran alone and stopped waiting for (a test's timeout, Ctrl-C)
leaves the ranks' numbering of later anonymous ops in step (core/collectives/anon_names.py): the
cascade of timeouts seen in Horovod's test_tensorflow.py, where every test after one that
timed out waited for names the other rank never used."""

from __future__ import annotations

from tfjobs import WORKERS, fastpsrun, tail


def test_anonymous_ops_stay_in_step_after_a_wait_cut_short() -> None:
    # The op timeout (200 s) is far above the job's limit: a rank whose numbering moved
    # on would wait for it, so only matching names pass.
    res = fastpsrun(2, [str(WORKERS / "tf_cut_short_worker.py")], timeout=150, op_timeout=200)
    assert res.returncode == 0, tail(res)
    for rank in range(2):
        assert f"{rank} cut short OK" in res.stdout, tail(res)
