"""The training run of test_drain.py: least squares on the fixed batches of train_elastic.py
(the global batch split evenly over the current world, so the final parameters equal a
single-process run of the same steps when every step is applied once), while a host leaves
the discovery output.

Every rank prints ``APPLIED slot=... step=k gen=g size=n`` after each step it applied, and
``RESTORE slot=... step=k`` when its state is restored (a rollback), so the test sees
whether a survivor ever went back. At the end every rank that finished writes its
parameters to ``RESULT_DIR/<slot>.json``.

Environment:
  STEPS         number of steps (default 18)
  STEP_SLEEP    seconds of "compute" per step (default 0.3)
  COMMIT_EVERY  commit after every k-th step (default 3): a rollback then redoes steps
  SHRINK_AT     ``step@file@text``: rank 0 writes ``text`` (newlines as ';') to ``file``
                (the discovery script's source) right after the step whose counter reaches
                ``step`` (after its commit, if it has one)
  HANG_AT       ``slot@step``: the worker on that slot sleeps (at most HANG_SECONDS, default
                300) at the start of step ``step``: it never reaches its next commit
  RESULT_DIR    where each rank that finishes writes its final parameters
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import fastps.torch as hvd
from fastps.elastic import rendezvous

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from train_elastic import BATCH, batch, make_model, make_optimizer  # noqa: E402


def main() -> None:
    steps = int(os.environ.get("STEPS", "18"))
    sleep = float(os.environ.get("STEP_SLEEP", "0.3"))
    commit_every = int(os.environ.get("COMMIT_EVERY", "3"))
    me = os.environ.get("FASTPS_ELASTIC_ID", "")
    shrink = os.environ.get("SHRINK_AT", "")
    hang_slot, _, hang_step = os.environ.get("HANG_AT", "").partition("@")
    hang_at = int(hang_step) if hang_slot == me else -1
    hang_seconds = float(os.environ.get("HANG_SECONDS", "300"))

    hvd.init()
    model = make_model()
    opt = hvd.DistributedOptimizer(make_optimizer(model), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    restore = state.restore

    def restore_and_say() -> None:
        print(f"RESTORE slot={me} step={state.step} t={time.time():.3f}", flush=True)
        restore()

    state.restore = restore_and_say

    @hvd.elastic.run
    def train(state) -> None:
        while state.step < steps:
            if state.step == hang_at:
                print(f"HANG slot={me} step={state.step} t={time.time():.3f}", flush=True)
                time.sleep(hang_seconds)
            n, r = hvd.size(), hvd.rank()
            assert BATCH % n == 0, f"world of {n} does not divide the batch"
            x, y = batch(state.step)
            rows = BATCH // n
            xs, ys = x[r * rows : (r + 1) * rows], y[r * rows : (r + 1) * rows]
            opt.zero_grad()
            ((model(xs) - ys) ** 2).mean().backward()
            opt.step()
            state.step += 1
            gen = rendezvous.generation()
            print(
                f"APPLIED slot={me} step={state.step} gen={gen} size={n} t={time.time():.3f}",
                flush=True,
            )
            time.sleep(sleep)
            if state.step % commit_every == 0 or state.step == steps:
                state.commit()
            if shrink and r == 0:
                at, path, text = shrink.split("@")
                if state.step == int(at):
                    Path(path).write_text(text.replace(";", "\n") + "\n")
                    print(f"SHRINK step={state.step} t={time.time():.3f}", flush=True)

    train(state)
    out = Path(os.environ["RESULT_DIR"]) / f"{me}.json"
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    out.write_text(json.dumps({"params": params, "size": hvd.size(), "step": state.step}))
    print(f"DONE slot={me} rank={hvd.rank()} size={hvd.size()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
