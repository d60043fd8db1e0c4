"""The placement plan without a job (core/control/placement.py): the optimal split of summation
work (BytePS Eq. 1, 2), its byte balance, the pacing plan and the rack-level hierarchy's
routes and shares. The sums on emulated machines: tests/integration/test_placement.py."""

from __future__ import annotations

import numpy as np
import pytest
from fastps import _core
from fastps.config import Config
from fastps.control import placement
from fastps.control.linkspeed import interface_mtu, payload_fraction, payload_fraction_for_mtu
from fastps.control.placement import (
    ANSWER_HEADROOM,
    PUSH_HEADROOM,
    ServerSpot,
    optimal_time,
    pacing_plan,
    parse_bandwidths,
    server_weights,
)
from fastps.errors import FastPSError
from fastps.worker.api import worker_options


def layout(n: int, k: int):
    workers = [f"w{i}" for i in range(n)]
    servers = [ServerSpot(i, f"w{i}") for i in range(n)]
    servers += [ServerSpot(n + j, f"c{j}") for j in range(k)]
    return workers, servers


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("k", [0, 1, 2, 4, 5])
def test_weights_follow_eq1_and_eq2(n: int, k: int) -> None:
    w = server_weights(*layout(n, k))
    assert abs(sum(w) - 1) < 1e-9
    if k == 0:
        assert w == pytest.approx([1 / n] * n)
    elif k >= n:
        assert w[:n] == pytest.approx([0.0] * n)
        assert w[n:] == pytest.approx([1 / k] * k)
    else:
        d = n * n + k * n - 2 * k
        assert w[:n] == pytest.approx([(n - k) / d] * n)
        assert w[n:] == pytest.approx([2 * (n - 1) / d] * k)


def test_unequal_cpu_bandwidth_gets_proportional_share() -> None:
    workers, servers = layout(4, 2)
    w = server_weights(workers, servers, parse_bandwidths("c0=1000,c1=500,w0=1000"))
    assert w[4] == pytest.approx(2 * w[5])
    # The balance condition: a CPU machine's time n*x/b equals a worker machine's (1+(n-2)y)/B.
    n, y = 4, w[0]
    assert n * w[4] / 1000 == pytest.approx((1 + (n - 2) * y) / 1000)
    with pytest.raises(Exception, match="c0=fast"):
        parse_bandwidths("c0=fast")


def test_unlisted_hosts_take_the_stated_link_rate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Naming only the slow CPU machine: with FASTPS_LINK_MBIT stated, the others run at it
    (the slow one gets half a fast one's share); without it they take the fastest listed rate
    (all equal) and a warning names them."""
    from types import SimpleNamespace

    from fastps.control.placement import membership_weights

    workers, servers = layout(4, 2)
    m = SimpleNamespace(
        workers=[SimpleNamespace(hostname=h) for h in workers],
        servers=[SimpleNamespace(id=s.id, hostname=s.hostname) for s in servers],
    )
    monkeypatch.setenv("FASTPS_HOST_BANDWIDTHS", "c1=500")
    monkeypatch.setenv("FASTPS_LINK_MBIT", "1000")
    w = membership_weights(m)
    assert w == pytest.approx(server_weights(workers, servers, {"c1": 500.0}, 1000.0))
    assert w[4] == pytest.approx(2 * w[5])
    monkeypatch.setenv("FASTPS_LINK_MBIT", "auto")
    with caplog.at_level("WARNING", logger="fastps.placement"):
        w = membership_weights(m)
    assert w[4] == pytest.approx(w[5])
    assert "does not name c0, w0, w1, w2, w3" in caplog.text


def test_optimal_time_matches_allreduce_and_ps_limits() -> None:
    m, b = 100.0, 10.0
    assert optimal_time(4, 0, m, b) == pytest.approx(2 * 3 * m / (4 * b))  # ring all-reduce
    assert optimal_time(4, 4, m, b) == pytest.approx(m / b)  # PS with as many CPU machines


@pytest.mark.parametrize("n,k", [(4, 0), (4, 1), (4, 2), (4, 4), (2, 1)])
def test_parts_are_balanced_by_bytes_and_identical_on_every_worker(n: int, k: int) -> None:
    rng = np.random.default_rng(0)
    shapes = (
        [64 * 3 * 49]
        + [
            int(x)
            for x in rng.choice(
                [256, 2048, 64 * 64 * 9, 256 * 256 * 9, 512 * 512 * 9, 2048 * 512], 160
            )
        ]
        + [2048 * 1000]
    )
    w = np.array(server_weights(*layout(n, k)))
    loads = []
    for rank in range(2):
        cfg = Config(rank=rank, num_workers=2, job_id="j", token="t")
        opts = worker_options(
            cfg, ["h0", "h1"], servers=["127.0.0.1:1"] * len(w), server_weights=list(w)
        )
        wk = _core.Worker(opts)
        load = np.zeros(len(w))
        for i, s in enumerate(shapes):
            for _off, ln, sid in wk.part_layout(f"layer{i}.weight", s * 4, 4):
                load[sid] += ln
        loads.append(load)
    assert np.array_equal(loads[0], loads[1])
    share = loads[0] / loads[0].sum()
    assert np.all(np.abs(share - w) <= 0.05 * w + 1e-12), (share, w)


def _egress(worker_hosts, server_hosts, w_rates, s_rates):
    """Bytes/s leaving each host under a pacing plan, pushes and answers without their
    headroom."""
    out: dict = {}
    for r, wh in enumerate(worker_hosts):
        for s, sh in enumerate(server_hosts):
            out[wh] = out.get(wh, 0.0) + w_rates[r][s] / PUSH_HEADROOM
            out[sh] = out.get(sh, 0.0) + s_rates[s][r] / ANSWER_HEADROOM
    return out


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("k", [0, 1, 2, 4])
@pytest.mark.parametrize("local", [1, 2])
def test_pacing_fills_each_link_in_proportion_to_bytes(n: int, k: int, local: int) -> None:
    worker_hosts = [f"w{i // local}" for i in range(n * local)]
    servers = layout(n, k)[1]
    server_hosts = [s.hostname for s in servers]
    weights = server_weights([f"w{i}" for i in range(n)], servers)
    w_rates, s_rates = pacing_plan(worker_hosts, server_hosts, weights, 1000.0)
    link = 1000e6 / 8
    for host, rate in _egress(worker_hosts, server_hosts, w_rates, s_rates).items():
        if rate > 0:  # a colocated server with no share at k >= n sends nothing
            assert rate == pytest.approx(link), host
    for r, wh in enumerate(worker_hosts):
        for s, sh in enumerate(server_hosts):
            if sh == wh:
                # Same host: shared memory or loopback, never paced.
                assert w_rates[r][s] == 0 and s_rates[s][r] == 0
            elif weights[s] > 0:
                # Flows out of one host are in the ratio of their bytes.
                ref = next(t for t, h in enumerate(server_hosts) if h != wh and weights[t] > 0)
                assert w_rates[r][s] / w_rates[r][ref] == pytest.approx(weights[s] / weights[ref])


def test_pacing_k1_gives_the_cpu_flow_twice_a_colocated_flow() -> None:
    # n = 4, k = 1: colocated shares 1/6, the CPU server 1/3 (Eq. 1/2). Out of a worker host:
    # 3 pushes of 1/6, 1 of 1/3 and 3 answers of 1/6 (4/3 in all) share 1000 Mbit/s.
    workers, servers = layout(4, 1)
    weights = server_weights(workers, servers)
    w_rates, s_rates = pacing_plan(workers, [s.hostname for s in servers], weights, 1000.0)
    mbit = [round(r * 8 / 1e6 / PUSH_HEADROOM, 6) for r in w_rates[0]]
    assert mbit == [0, 125, 125, 125, 250]
    assert [round(r * 8 / 1e6, 6) for r in s_rates[4]] == [250 * ANSWER_HEADROOM] * 4
    assert [round(r * 8 / 1e6, 6) for r in s_rates[0]] == [0] + [125 * ANSWER_HEADROOM] * 3


def test_pacing_unstated_link_leaves_flows_unpaced_and_honours_host_rates() -> None:
    workers, servers = layout(2, 1)
    hosts = [s.hostname for s in servers]
    weights = server_weights(workers, servers)
    w_rates, s_rates = pacing_plan(workers, hosts, weights, 0.0)
    assert all(r == 0 for row in w_rates + s_rates for r in row)
    # A CPU host with a slower link: its answers share its own rate.
    w_rates, s_rates = pacing_plan(workers, hosts, weights, 1000.0, {"c0": 400.0})
    out = _egress(workers, hosts, w_rates, s_rates)
    assert out["c0"] == pytest.approx(400e6 / 8) and out["w0"] == pytest.approx(1000e6 / 8)


def test_push_caps_are_shares_of_the_links_payload_rate() -> None:
    # The caps count TCP payload, a link's rate counts frames: at MTU 1500 a worker's
    # pushes get their share of 1448/1514 of the link, with PUSH_HEADROOM; answers keep
    # their share of the link's rate with ANSWER_HEADROOM.
    workers, servers = layout(4, 1)
    hosts = [s.hostname for s in servers]
    weights = server_weights(workers, servers)
    frac = payload_fraction_for_mtu(1500)
    assert frac == pytest.approx(1448 / 1514)
    plain = pacing_plan(workers, hosts, weights, 1000.0)
    w_rates, s_rates = pacing_plan(workers, hosts, weights, 1000.0, payload_fraction=frac)
    for r in range(4):
        for s in range(len(hosts)):
            assert w_rates[r][s] == pytest.approx(plain[0][r][s] * frac)
    assert s_rates == plain[1]
    assert w_rates[0][4] * 8 / 1e6 == pytest.approx(250 * frac * PUSH_HEADROOM)
    # Pushes alone stay below the link's payload rate, so they cannot queue at its shaper.
    assert sum(w_rates[0]) * 8 / 1e6 < 1000 * frac
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="payload_fraction"):
            pacing_plan(workers, hosts, weights, 1000.0, payload_fraction=bad)


def test_payload_fraction_follows_the_mtu() -> None:
    assert payload_fraction_for_mtu(9000) == pytest.approx(8948 / 9014)
    assert payload_fraction_for_mtu(1500) < payload_fraction_for_mtu(9000) < 1
    with pytest.raises(ValueError, match="MTU of 40"):
        payload_fraction_for_mtu(40)
    # Loopback or an address no interface holds: MTU 1500 assumed.
    assert payload_fraction("198.18.255.254") == pytest.approx(1448 / 1514)
    lo_mtu = interface_mtu("lo")
    assert lo_mtu is None or lo_mtu > 1500
    assert interface_mtu("no-such-interface-fastps") is None


# --- rack-level hierarchy (placement.rack_plan) -------------------------------------------


def test_rack_plan_routes_each_part_through_its_racks_relay() -> None:
    # Two racks of two workers, one server beside each worker.
    plan = placement.rack_plan(["a", "a", "b", "b"], ["0", "1", "2", "3"], ["a", "a", "b", "b"])
    assert plan is not None
    # Rack a pushes servers 2 and 3's parts to its own servers 0 and 1, and vice versa.
    assert plan.relay_via[0] == [0, 1, 0, 1] and plan.relay_via[1] == [0, 1, 0, 1]
    assert plan.relay_via[2] == [2, 3, 2, 3] and plan.relay_via[3] == [2, 3, 2, 3]
    # An owner waits for its rack's two workers and one relay from the other rack.
    assert plan.owner_pushers == [3, 3, 3, 3]
    assert plan.rack_pushers == [2, 2, 2, 2]
    assert plan.relay_rank == {"a": 0, "b": 2}


def test_rack_plan_counts_hosts_with_local_reduce_and_racks_without_servers() -> None:
    plan = placement.rack_plan(
        ["a", "a", "a", "b", "c"], ["h0", "h0", "h1", "h2", "h3"], ["a", "b"]
    )
    assert plan is not None
    # Rack a: hosts h0 and h1; rack b relays; rack c has no server and pushes directly.
    assert plan.owner_pushers == [2 + 1 + 1, 1 + 1 + 1]
    assert plan.relay_via[4] == [0, 1]
    assert plan.rack_pushers == [2, 2, 2, 1, 1]
    assert plan.relay_rank == {"a": 0, "b": 3}


def test_rack_plan_is_flat_without_racks_and_refuses_half_named_jobs() -> None:
    assert placement.rack_plan(["", ""], ["0", "1"], [""]) is None
    assert placement.rack_plan(["a", "a"], ["0", "1"], ["a"]) is None  # one rack
    with pytest.raises(FastPSError, match="worker 1 names no rack"):
        placement.rack_plan(["a", ""], ["0", "1"], ["a"])
    with pytest.raises(FastPSError, match="server 0 names no rack"):
        placement.rack_plan(["a", "b"], ["0", "1"], [""])
    with pytest.raises(FastPSError, match="a host is in one rack"):
        placement.rack_plan(["a", "b"], ["h0", "h0"], ["a", "b"])


def test_rack_shares_balance_uplinks() -> None:
    assert placement.rack_shares([1000, 250]) == [0.5, 0.5]  # two racks: any split costs M/U
    shares = placement.rack_shares([1000, 1000, 1000])
    assert shares == pytest.approx([1 / 3] * 3)
    shares = placement.rack_shares([2000, 1000, 1000])
    # Equal uplink time (1 + (r-2) w) / U over the racks.
    times = [(1 + w) / u for w, u in zip(shares, [2000, 1000, 1000])]
    assert sum(shares) == pytest.approx(1.0)
    assert max(times) == pytest.approx(min(times))
    # A rack too slow for any share owns none.
    shares = placement.rack_shares([1000, 1000, 10])
    assert shares[2] == 0.0 and sum(shares) == pytest.approx(1.0)


def test_bounds_for_two_racks_of_four_behind_4_to_1_uplinks() -> None:
    m = 100e6
    hier = placement.hierarchy_bound([4, 4], 1000, [1000, 1000], m)
    flat = placement.flat_bound([4, 4], 1000, [1000, 1000], m)
    # In-rack all-reduce term 2(n-1)/n M/B = 1.75 M/B; flat: 4 M/U over each uplink.
    assert hier == pytest.approx(1.75 * m / 125e6)
    assert flat == pytest.approx(4 * m / 125e6)
    # A slower uplink makes the uplink term the bound: M/U.
    assert placement.hierarchy_bound([4, 4], 1000, [250, 250], m) == pytest.approx(m / 31.25e6)


def test_rack_weights_split_each_racks_share_over_its_servers() -> None:
    w = placement.rack_server_weights(["a", "b"], ["a", "a", "b", "x"])
    assert w == pytest.approx([0.25, 0.25, 0.5, 0.0])  # rack x has no workers


def _rack_egress(worker_hosts, server_hosts, rates):
    """Bytes/s leaving each host under a rack pacing plan, headroom taken off."""
    out: dict = {}

    def add(host: str, r: float) -> None:
        out[host] = out.get(host, 0.0) + r

    for r, wh in enumerate(worker_hosts):
        for s, sh in enumerate(server_hosts):
            add(wh, rates.worker_rates[r][s])
            add(sh, rates.server_rates[s][r] / ANSWER_HEADROOM)
    for v, vh in enumerate(server_hosts):
        for g, gh in enumerate(server_hosts):
            add(vh, rates.relay_rates[v][g] / ANSWER_HEADROOM)
            add(gh, rates.relay_answer_rates[g][v] / ANSWER_HEADROOM)
    return out


def test_rack_pacing_splits_each_link_by_the_hierarchys_bytes() -> None:
    # 2 racks x 4 hosts, a worker and a server on each: out of a host go 3 pushes and 3
    # answers of 1/4 of the model (own share + relayed share) and one rack sum up and one
    # answer to the other rack's relay of 1/8: 1.75 M sharing the link in that ratio.
    racks = [f"r{i // 4}" for i in range(8)]
    hosts = [f"h{i}" for i in range(8)]
    plan = placement.rack_plan(racks, hosts, racks)
    weights = placement.rack_server_weights(racks, racks)
    rates = placement.rack_pacing_plan(hosts, hosts, weights, plan, 700.0)
    mbit = lambda r: round(r * 8 / 1e6, 6)  # noqa: E731
    assert [mbit(r) for r in rates.worker_rates[0]] == [0, 100, 100, 100, 0, 0, 0, 0]
    assert [mbit(r) for r in rates.server_rates[5]] == [0] * 4 + [150, 0, 150, 150]
    # Server 1 relays rack r0's sums for owner 5 (index 1 in its rack), which answers it.
    assert [mbit(r) for r in rates.relay_rates[1]] == [0] * 5 + [50 * ANSWER_HEADROOM, 0, 0]
    assert [mbit(r) for r in rates.relay_answer_rates[5]] == [0, 50 * ANSWER_HEADROOM] + [0] * 6
    for host, rate in _rack_egress(hosts, hosts, rates).items():
        assert rate == pytest.approx(700e6 / 8), host
    # No stated link: nothing paced.
    unpaced = placement.rack_pacing_plan(hosts, hosts, weights, plan, 0.0)
    assert not any(r for m in (unpaced.worker_rates, unpaced.relay_rates) for row in m for r in row)


def test_rack_pacing_with_local_reduce_and_a_rack_without_servers() -> None:
    # Rack a: hosts h0 (two workers, reducing locally) and h1; rack b: h2; rack c: h3 with
    # no server, whose worker pushes straight to the owners across its uplink.
    wracks, whosts = ["a", "a", "a", "b", "c"], ["h0", "h0", "h1", "h2", "h3"]
    sracks, shosts = ["a", "a", "b"], ["h0", "h1", "h2"]
    plan = placement.rack_plan(wracks, whosts, sracks)
    weights = placement.rack_server_weights(wracks, sracks)
    rates = placement.rack_pacing_plan(whosts, shosts, weights, plan, 1000.0)
    for host, rate in _rack_egress(whosts, shosts, rates).items():
        assert rate == pytest.approx(1000e6 / 8), host
    # h0's two workers each push half of what h0 sends to h1; h3 pushes to every owner.
    assert rates.worker_rates[0][1] == rates.worker_rates[1][1] > 0
    assert all(r > 0 for r in rates.worker_rates[4])
    assert rates.relay_rates[2][0] > 0 and rates.relay_rates[0][2] > 0


def test_burst_rate_is_the_hosts_own_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's or server's short bursts go at its host's link rate: its
    FASTPS_HOST_BANDWIDTHS entry, else the job's link rate; nothing when pacing is off."""
    monkeypatch.setenv("FASTPS_HOST_BANDWIDTHS", "c1=500")
    assert placement.host_link_bytes_per_s("c1", 1000.0) == pytest.approx(500e6 / 8)
    assert placement.host_link_bytes_per_s("w0", 1000.0) == pytest.approx(1000e6 / 8)
    assert placement.host_link_bytes_per_s("c1", 0.0) == 0.0
    monkeypatch.delenv("FASTPS_HOST_BANDWIDTHS")
    assert placement.host_link_bytes_per_s("c1", 100.0) == pytest.approx(100e6 / 8)
