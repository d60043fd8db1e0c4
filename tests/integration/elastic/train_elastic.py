"""An elastic training run the tests drive: least squares on a fixed stream of batches.

Every step's global batch (12 rows) is split evenly over the current world, so the averaged
gradient -- and the final parameters -- do not depend on how many workers ran which step,
only on every step being applied once to the committed state. The tests compare the final
parameters with a single-process run of the same steps (``reference``).

Environment:
  STEPS        number of steps (default 30)
  STEP_SLEEP   seconds of "compute" per step (default 0.1), after the step
  COMPUTE_SLEEP  seconds of "compute" before the backward pass (default 0): what a
               rollback does again and a survivor that stays in place does not
  FAIL_AT      comma-separated ``slot@step@where``: the worker on that slot SIGKILLs itself
               at that step, ``where`` = backward (inside a gradient hook, with push_pulls in
               flight), commit (after saving, before the commit's collective) or reset
               (in its first reset callback, while the new generation forms; give step -1)
               or hang (in the backward pass, like backward, but SIGSTOP: the process hangs
               and only the scheduler's heartbeat verdict tells it is gone)
  GROW_AT      ``step@file@text``: rank 0 writes ``text`` (newlines as ';') to ``file`` (the
               discovery script's source) when it reaches ``step``
  WAIT_SIZE    ``size@seconds``: while the world is smaller than ``size``, each step
               sleeps 0.5 s more (at most ``seconds`` in all), so a joining worker that
               starts slowly (a loaded machine) still joins before the last step
  HOLD_FOR_SIZE   ``size@step@seconds``: from ``step`` on, while the world is smaller than
               ``size``, every rank commits every 0.5 s without stepping (at most ``seconds``
               in all, rank 0's clock decides), so a worker that starts slowly joins before
               the training ends
  KILL_SERVER_AT  step at which rank 0 SIGKILLs the generation's server 0
  ADD_SERVER_AT   ``step@id@epoch`` (with FASTPS_ELASTIC_SERVERS=1): rank 0 starts
               ``python -m fastps.server`` with FASTPS_SERVER_ID=id and the settings
               fastpsrun wrote in $TMPDIR for the running generation; at the next step every
               rank waits (bounded) until its core runs in server epoch ``epoch``, so the
               steps after run on the new server whatever its start-up takes
  FAIL_ON_FILE ``slot@path``: the worker on that slot SIGKILLs itself in the backward pass
               of the first step it starts once ``path`` exists (benchmarks: a kill inside
               the first step after a commit, at a time the benchmark picks)
  COMMIT_EVERY commit after every k-th step (default 1); a failure later than the first
               step after a commit cannot be met in place (FASTPS_ELASTIC_INPLACE=1)
  RESULT       where rank 0 writes the final parameters (JSON)

Each worker prints ``RESTORE slot=...`` when its state is restored and ``RESET slot=...``
in its reset callback, so the tests see who rolled back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import fastps.torch as hvd
import torch

BATCH = 12
FEATURES = 8


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64)
    w = torch.arange(1, FEATURES + 1, dtype=torch.float64).unsqueeze(1) / FEATURES
    y = x @ w + 0.5 + 0.01 * torch.randn(BATCH, 1, generator=g, dtype=torch.float64)
    return x, y


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def reference(steps: int) -> list:
    """The same steps in one process, on the whole batch."""
    model = make_model()
    opt = make_optimizer(model)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def _failures(me: str):
    out = {}
    for item in filter(None, os.environ.get("FAIL_AT", "").split(",")):
        slot, step, where = item.split("@")
        if slot == me:
            out[int(step)] = where
    return out


def _die(where: str, step: int) -> None:
    print(
        f"KILL {os.environ.get('FASTPS_ELASTIC_ID')} step={step} where={where} t={time.time():.3f}",
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGSTOP if where == "hang" else signal.SIGKILL)


def _kill_server(step: int) -> None:
    """SIGKILLs this generation's server 0 (found by its job id in /proc)."""
    job = f"FASTPS_JOB_ID={os.environ['FASTPS_JOB_ID']}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"fastps.server" in cmd and job in env and b"FASTPS_SERVER_ID=0" in env:
            print(f"KILL server pid={pid} step={step} t={time.time():.3f}", flush=True)
            os.kill(int(pid), signal.SIGKILL)
            return
    raise RuntimeError("no server of this generation found")


def _add_server(sid: int, step: int) -> subprocess.Popen:
    """Starts a server by hand, as docs/guide/elastic.md says, for the running generation."""
    base = os.environ["FASTPS_ELASTIC_JOB_ID"]
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fastps-{base}-servers.env")
    env = dict(os.environ)
    env.pop("FASTPS_RANK", None)
    for line in open(path):
        k, _, v = line.removeprefix("export ").strip().partition("=")
        env[k] = v
    env["FASTPS_SERVER_ID"] = str(sid)
    print(f"ADD server id={sid} step={step} t={time.time():.3f}", flush=True)
    return subprocess.Popen([sys.executable, "-m", "fastps.server"], env=env)


def main() -> None:
    steps = int(os.environ.get("STEPS", "30"))
    sleep = float(os.environ.get("STEP_SLEEP", "0.1"))
    compute = float(os.environ.get("COMPUTE_SLEEP", "0"))
    me = os.environ.get("FASTPS_ELASTIC_ID", "")
    fail = _failures(me)
    fail_slot, _, fail_file = os.environ.get("FAIL_ON_FILE", "").partition("@")
    if fail_slot != me:
        fail_file = ""
    grow = os.environ.get("GROW_AT", "")
    wait = os.environ.get("WAIT_SIZE", "")
    kill_server = [int(os.environ.get("KILL_SERVER_AT", "-1"))]
    hold = os.environ.get("HOLD_FOR_SIZE", "")
    hold_size, hold_step, hold_s = (int(x) for x in hold.split("@")) if hold else (0, 0, 0)
    hold_until = time.time() + hold_s
    add = os.environ.get("ADD_SERVER_AT", "")
    add_at, add_id, add_epoch = (int(x) for x in add.split("@")) if add else (-1, 0, 0)
    added: list = []
    waited: list = []
    wait_size = int(wait.split("@")[0]) if wait else 0
    wait_until = time.time() + (float(wait.split("@")[1]) if wait else 0.0)

    hvd.init()
    model = make_model()
    opt = hvd.DistributedOptimizer(make_optimizer(model), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    resets = []
    commit_every = int(os.environ.get("COMMIT_EVERY", "1"))
    restore = state.restore

    def restore_and_say() -> None:
        print(f"RESTORE slot={me} step={state.step} t={time.time():.3f}", flush=True)
        restore()

    state.restore = restore_and_say

    def on_reset() -> None:
        print(f"RESET slot={me} rank={hvd.rank()} t={time.time():.3f}", flush=True)
        resets.append((hvd.size(), time.time()))
        for step, where in list(fail.items()):
            if where == "reset":
                _die("reset", step)

    state.register_reset_callbacks([on_reset])
    armed = {"where": None}

    def hook(_grad):
        if armed["where"] in ("backward", "hang"):
            _die(armed["where"], state.step)

    model.weight.register_hook(hook)

    @hvd.elastic.run
    def train(state) -> None:
        while state.step < steps:
            n, r = hvd.size(), hvd.rank()
            assert BATCH % n == 0, f"world of {n} does not divide the batch"
            x, y = batch(state.step)
            rows = BATCH // n
            xs, ys = x[r * rows : (r + 1) * rows], y[r * rows : (r + 1) * rows]
            armed["where"] = fail.pop(state.step, None)
            if fail_file and os.path.exists(fail_file):
                armed["where"] = "backward"
            if r == 0 and state.step == kill_server[0]:
                kill_server[0] = -1
                _kill_server(state.step)
            if r == 0 and state.step == add_at and not added:
                added.append(_add_server(add_id, state.step))
            if add and state.step == add_at + 1 and not waited:
                import fastps.worker.api as api

                waited.append(state.step)

                worker = api._st().worker
                got = worker.server_epoch(add_epoch, timeout=120.0)
                if r == 0:
                    print(f"SERVER_EPOCH {got} step={state.step}", flush=True)
            opt.zero_grad()
            loss = ((model(xs) - ys) ** 2).mean()
            if compute:
                time.sleep(compute)
            loss.backward()
            opt.step()
            state.step += 1
            time.sleep(sleep)
            if r == 0:
                print(f"STEP {state.step} size={n} t={time.time():.3f}", flush=True)
                if grow:
                    at, path, text = grow.split("@")
                    if state.step == int(at):
                        with open(path, "w") as f:
                            f.write(text.replace(";", "\n") + "\n")
            if armed["where"] == "commit":
                state.save()
                _die("commit", state.step)
            if state.step % commit_every == 0 or state.step == steps:
                state.commit()
            if wait_size and hvd.size() < wait_size and time.time() < wait_until:
                time.sleep(0.5)
            while hold and state.step >= hold_step and hvd.size() < hold_size:
                if not hvd.broadcast_object(time.time() < hold_until, root_rank=0):
                    break
                time.sleep(0.5)
                state.commit()  # raises HostsUpdatedInterrupt once the newcomer is ready

    train(state)
    if hvd.rank() == 0 and os.environ.get("RESULT"):
        with open(os.environ["RESULT"], "w") as f:
            json.dump(
                {
                    "params": [p.detach().flatten().tolist() for p in model.parameters()],
                    "size": hvd.size(),
                    "resets": resets,
                },
                f,
            )
    print(f"DONE rank={hvd.rank()} size={hvd.size()}", flush=True)
    hvd.shutdown()  # the generation ends once every worker left: the added server too
    for p in added:
        p.wait(timeout=60)  # it leaves with the generation it joined


if __name__ == "__main__":
    sys.exit(main())
