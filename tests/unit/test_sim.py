"""fastps.sim: the fluid network, closed-form cases, the real placement / partitioner /
push scheduler it drives, grouped hosts against per-host simulation, determinism."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from fastps import _core
from fastps.control import placement
from fastps.errors import FastPSError
from fastps.sim import Cluster, CommOptions, TrainOptions, communicate, layout, train, workload
from fastps.sim.bound import byteps_bound, link_bound, ring_allreduce
from fastps.sim.cluster import group_pacing
from fastps.sim.network import fair_rates

ROOT = Path(__file__).resolve().parents[2]
FAST_SERVER = dict(kernel_gbps=1e9, message_s=0.0)  # summing takes no time


def one_tensor(tmp_path: Path, nbytes: int, compute_s: float = 0.0) -> workload.Workload:
    doc = {
        "name": "one",
        "layers": [
            {
                "name": "l",
                "forward_s": compute_s / 3,
                "backward_s": 2 * compute_s / 3,
                "tensors": {"w": nbytes},
            }
        ],
    }
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    return workload.from_file(str(path))


def test_fair_rates_max_min_with_caps() -> None:
    # two unpaced flows on one link share it evenly
    assert fair_rates({"a": 10.0}, [({"a": 1.0}, None), ({"a": 1.0}, None)]) == [5.0, 5.0]
    # paced flows that fit get their caps; the unpaced flow on another link takes the rest
    r = fair_rates(
        {"a": 10.0, "b": 10.0}, [({"a": 1.0}, 2.0), ({"a": 1.0}, 3.0), ({"b": 1.0}, None)]
    )
    assert r == [pytest.approx(2.0), pytest.approx(3.0), pytest.approx(10.0)]
    # a paced flow below its fair share keeps its pace; the unpaced one takes the rest
    r = fair_rates({"a": 10.0}, [({"a": 1.0}, 2.0), ({"a": 1.0}, None)])
    assert r == [pytest.approx(2.0), pytest.approx(8.0)]
    # a flow standing for 3 copies on a link loads it 3x
    r = fair_rates({"a": 12.0, "b": 100.0}, [({"a": 3.0, "b": 1.0}, None)])
    assert r == [pytest.approx(4.0)]
    # paced flows on an overloaded link: max-min, the smaller cap is met in full
    r = fair_rates({"a": 10.0}, [({"a": 1.0}, 4.0), ({"a": 1.0}, 12.0)])
    assert r == [pytest.approx(4.0), pytest.approx(6.0)]
    # headroom above a base rate only takes spare room: a busy link gives the base...
    r = fair_rates({"a": 10.0}, [({"a": 1.0}, 6.0), ({"a": 1.0}, 6.0, 4.0)])
    assert r == [pytest.approx(6.0), pytest.approx(4.0)]
    # ...an idle one up to the cap, and the spare room of a half-busy one
    assert fair_rates({"a": 10.0}, [({"a": 1.0}, 6.0, 4.0)]) == [pytest.approx(6.0)]
    r = fair_rates({"a": 10.0}, [({"a": 1.0}, 5.0), ({"a": 1.0}, 9.0, 3.0)])
    assert r == [pytest.approx(5.0), pytest.approx(5.0)]
    # the filling runs only where the caps do not fit; a flow across both kinds of link
    r = fair_rates(
        {"a": 10.0, "b": 10.0},
        [({"a": 1.0, "b": 1.0}, None), ({"a": 1.0}, None), ({"b": 1.0}, 2.0)],
    )
    assert r == [pytest.approx(5.0), pytest.approx(5.0), pytest.approx(2.0)]


def test_one_part_equals_closed_form(tmp_path: Path) -> None:
    # n = 2, k = 0, unpaced, one part for one server: the other worker pushes P, the server
    # answers P: 2P/B plus two one-way latencies, exactly.
    p = 200_000
    w = one_tensor(tmp_path, p)
    c = Cluster(workers=2, link_mbit=800.0, goodput=1.0, latency_s=1e-4)
    r = communicate(
        c,
        w,
        CommOptions(paced=False, partition_bytes=1 << 20, **FAST_SERVER),
        TrainOptions(iterations=2, warmup=0),
    )
    bps = 800e6 / 8
    assert r.iteration_s == pytest.approx(2 * p / bps + 2e-4, rel=1e-9)


@pytest.mark.parametrize("n,k", [(4, 0), (4, 1), (4, 2), (4, 4), (3, 6)])
def test_large_tensor_reaches_byteps_bound(tmp_path: Path, n: int, k: int) -> None:
    m = 24 << 20
    w = one_tensor(tmp_path, m)
    c = Cluster(workers=n, cpu_machines=k, link_mbit=1000.0, goodput=1.0, latency_s=0.0)
    lay = layout(c)
    assert link_bound(lay, m) == pytest.approx(byteps_bound(lay, m), rel=1e-6)
    r = communicate(
        c,
        w,
        CommOptions(partition_bytes=64 << 10, **FAST_SERVER),
        TrainOptions(iterations=2, warmup=0),
    )
    assert r.bound_s * (1 - 1e-9) <= r.iteration_s <= 1.03 * r.bound_s, (
        n,
        k,
        r.iteration_s,
        r.bound_s,
    )


def test_bounds_closed_forms() -> None:
    for n, k in [(2, 0), (4, 2), (8, 8), (16, 3), (64, 100)]:
        lay = layout(Cluster(workers=n, cpu_machines=k, goodput=1.0, explicit=False))
        assert link_bound(lay, 1e8) == pytest.approx(
            placement.optimal_time(n, k, 1e8, 125e6), rel=1e-9
        ), (n, k)
    lay = layout(Cluster(workers=8, goodput=1.0, latency_s=0.0))
    assert ring_allreduce(lay, 1e8) == pytest.approx(2 * 7 / 8 * 1e8 / 125e6)
    # racks: 2 racks of 4 at 4:1 -> the uplink carries the cross-rack half of every sum
    lay = layout(Cluster(workers=8, racks=2, oversubscription=4.0, goodput=1.0, explicit=False))
    up = 4 * 1000 / 4.0 * 1e6 / 8
    # out of a rack: its 4 workers push the half summed in the other rack, and its 4
    # servers answer the other rack's 4 workers their half
    cross = (4 * 0.5 + 4 * 0.5) * 1e8
    assert link_bound(lay, 1e8) == pytest.approx(cross / up, rel=1e-9)


@pytest.mark.parametrize("explicit", [True, False])
def test_group_pacing_is_placement_pacing_plan(explicit: bool) -> None:
    c = Cluster(workers=5, cpu_machines=3, link_mbit=1000.0, goodput=1.0, explicit=explicit)
    lay = layout(c)
    push, answer = group_pacing(lay)
    hosts = [h for g in lay.groups for h in g.hosts]
    weights = placement.server_weights(
        [f"w{i}" for i in range(5)], [placement.ServerSpot(i, h) for i, h in enumerate(hosts)]
    )
    wr, sr = placement.pacing_plan([f"w{i}" for i in range(5)], hosts, weights, 1000.0)
    host_index = {h: i for i, h in enumerate(hosts)}
    for a in lay.worker_groups:
        r = host_index[a.hosts[0]]
        for s in lay.groups:
            f = lay.remote_fraction(a, s)
            members = [host_index[h] for h in s.hosts]
            real_push = sum(wr[r][j] for j in members)
            real_answer = sum(sr[j][r] for j in members)
            if f == 0:
                assert real_push == 0 and math.isinf(push[(a.index, s.index)])
                continue
            assert push[(a.index, s.index)] * f == pytest.approx(real_push, rel=1e-9)
            assert answer[(a.index, s.index)] * f == pytest.approx(real_answer, rel=1e-9)


def test_grouped_hosts_match_per_host_simulation(tmp_path: Path) -> None:
    w = workload.load("resnet50").with_compute(0.3)
    res = {}
    for explicit in (True, False):
        c = Cluster(workers=6, cpu_machines=2, link_mbit=2000.0, explicit=explicit)
        res[explicit] = train(c, w, None, TrainOptions(iterations=3, warmup=1)).iteration_s
    assert res[False] == pytest.approx(res[True], rel=0.05), res


def test_deterministic_for_a_seed() -> None:
    w = workload.load("resnet50").with_compute(0.2)
    c = Cluster(workers=4, cpu_machines=1, link_mbit=5000.0, explicit=False)

    def run(seed: int) -> list:
        r = train(c, w, None, TrainOptions(iterations=3, warmup=1, seed=seed, jitter=0.1))
        return [r.iteration_s] + sum(r.starts.values(), [])

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_never_beats_a_perfect_scheduler_and_priorities_help() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.emulator import models as em
    from benchmarks.emulator import schedule_bound as sb

    w = workload.load("resnet50")
    c = Cluster(workers=4, cpu_machines=0, link_mbit=1000.0, goodput=0.956, latency_s=0.0)
    bound = link_bound(layout(c), w.nbytes)
    w = w.with_compute(bound)  # the balanced point: compute = communication bound
    prio = train(c, w, None, TrainOptions(iterations=3, warmup=1)).iteration_s
    fifo = train(c, w, None, TrainOptions(iterations=3, warmup=1, priorities=False)).iteration_s
    sync = train(c, w, None, TrainOptions(iterations=3, warmup=1, mode="sync")).iteration_s
    best = sb.period(em.spec("resnet50"), bound, bound, cross_barrier=True, priority=True)
    best_sync = sb.period(em.spec("resnet50"), bound, bound, cross_barrier=False, priority=True)
    assert prio >= best * 0.999 and prio <= best * 1.10
    assert sync >= best_sync * 0.999
    assert fifo > prio * 1.1  # P3: without priorities the first layer's sum comes last


def test_straggler_sets_the_pace() -> None:
    w = workload.load("resnet50")
    fast = Cluster(workers=4, cpu_machines=2, link_mbit=25_000.0)
    slow = Cluster(workers=4, cpu_machines=2, link_mbit=25_000.0, slow_workers={2: 1.5})
    a = train(fast, w, None, TrainOptions(iterations=3, warmup=1)).iteration_s
    b = train(slow, w, None, TrainOptions(iterations=3, warmup=1)).iteration_s
    assert a == pytest.approx(w.compute_s, rel=0.02)
    assert b == pytest.approx(1.5 * w.compute_s, rel=0.02)


def test_real_partitioner_and_scheduler_bindings() -> None:
    tid = _core.tensor_id("grad.x")
    parts = _core.partition(256 << 10, [0.2, 0.8], tid, 10 << 20, 4)
    assert sum(ln for _, _, ln, _ in parts) == 10 << 20
    by_server = [sum(ln for _, _, ln, s in parts if s == j) for j in (0, 1)]
    assert by_server[1] / (10 << 20) == pytest.approx(0.8, abs=1e-3)
    with pytest.raises(ValueError, match="elem_size"):
        _core.partition(256, [1.0], tid, 100, 0)
    s = _core.PushScheduler(100, 0, [1.0])
    s.enqueue([(0, 5, 0, 0, 60, 0), (9, 6, 0, 0, 60, 0)])
    assert [t[0] for t in s.take_admissible()] == [9]  # most urgent first; credit holds
    s.written(0, 60)
    assert [t[0] for t in s.take_admissible()] == [0]


def test_bad_input_names_the_culprit(tmp_path: Path) -> None:
    with pytest.raises(FastPSError, match="workers must be >= 1"):
        layout(Cluster(workers=0))
    with pytest.raises(FastPSError, match="'w9'"):
        layout(Cluster(workers=4, host_mbit={"w9": 100.0}))
    with pytest.raises(FastPSError, match="slow worker 7"):
        layout(Cluster(workers=4, slow_workers={7: 2.0}))
    with pytest.raises(FastPSError, match="unknown model 'nope'"):
        workload.load("nope")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layers": [{"name": "x", "tensors": {"w": -1}}]}))
    with pytest.raises(FastPSError, match="layer 'x' tensor 'w'"):
        workload.from_file(str(bad))
    with pytest.raises(ValueError, match="compression"):
        CommOptions(compression=0.0).check()


def test_unequal_links_follow_placement(tmp_path: Path) -> None:
    # a CPU host with half the link takes half the share, and the time stays at the bound
    w = one_tensor(tmp_path, 16 << 20)
    c = Cluster(
        workers=4,
        cpu_machines=2,
        link_mbit=1000.0,
        goodput=1.0,
        latency_s=0.0,
        host_mbit={"c1": 500.0},
    )
    lay = layout(c)
    cpu = [s for g, s in zip(lay.groups, lay.server_share) if g.kind == "cpu"]
    assert cpu[1] == pytest.approx(cpu[0] / 2)
    r = communicate(
        c,
        w,
        CommOptions(partition_bytes=64 << 10, **FAST_SERVER),
        TrainOptions(iterations=2, warmup=0),
    )
    assert r.bound_s * (1 - 1e-9) <= r.iteration_s <= 1.05 * r.bound_s


@pytest.mark.parametrize("oversub", [1.0, 4.0])
def test_racks_reach_the_uplink_bound(tmp_path: Path, oversub: float) -> None:
    # 8 workers in 2 racks: at 4:1 the uplinks, not the hosts, bound the time
    w = one_tensor(tmp_path, 16 << 20)
    c = Cluster(
        workers=8,
        link_mbit=1000.0,
        goodput=1.0,
        latency_s=0.0,
        racks=2,
        oversubscription=oversub,
        explicit=False,
    )
    r = communicate(
        c,
        w,
        CommOptions(partition_bytes=64 << 10, **FAST_SERVER),
        TrainOptions(iterations=2, warmup=0),
    )
    hosts = byteps_bound(layout(c), 16 << 20)
    if oversub == 1.0:
        assert r.bound_s == pytest.approx(hosts)
    else:
        assert r.bound_s > 1.5 * hosts
    assert r.bound_s * (1 - 1e-9) <= r.iteration_s <= 1.05 * r.bound_s


def test_engine_with_zero_threads_sums_on_one() -> None:
    # FASTPS_ENGINE_THREADS=0 is a server summing on its receiving thread: one at a time.
    from fastps.sim.events import EventLoop
    from fastps.sim.pushpull import _Engine

    loop = EventLoop()
    done: list = []
    for threads, tag in ((0, "inline"), (2, "two")):
        eng = _Engine(loop, threads)
        for i in range(2):
            eng.run(1.0, lambda tag=tag, i=i: done.append((tag, i, loop.now)))
    loop.run()
    assert sorted(done) == [
        ("inline", 0, 1.0),
        ("inline", 1, 2.0),
        ("two", 0, 1.0),
        ("two", 1, 1.0),
    ]
