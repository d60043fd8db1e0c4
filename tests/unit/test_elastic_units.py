"""The elastic pieces that need no job: discovery output, the sampler, the state classes,
fastpsrun's seating of spares and its in-place decision. Discovery scripts and host updates
with real processes: tests/integration/elastic/test_host_discovery.py."""

from __future__ import annotations

import pytest
from fastps.elastic.state import ObjectState
from fastps.errors import FastPSError
from fastps.launch import discovery


def test_discovery_parses_slots_and_names_bad_lines():
    assert discovery.parse("localhost:2\n# c\n\nother\nlocalhost:1\n", "s") == {
        "localhost": 3,
        "other": 1,
    }
    assert discovery.slots({"a": 2, "b": 1}) == [("a", 0), ("a", 1), ("b", 0)]
    with pytest.raises(FastPSError, match=r"line 2: 'b:two' is not 'host:slots'"):
        discovery.parse("a:1\nb:two\n", "s")


def test_object_state_commit_restore_sync():
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, epoch=1, seen=[1])
    state.epoch = 2
    state.seen.append(2)
    state.save()
    state.epoch = 5
    state.seen.append(3)
    state.restore()
    assert (state.epoch, state.seen) == (2, [1, 2])
    calls = []
    state.register_reset_callbacks([lambda: calls.append(1)])
    state.on_reset()
    assert calls == [1]


def test_elastic_sampler_skips_processed_indices():
    torch = pytest.importorskip("torch")
    from fastps.torch.elastic import ElasticSampler

    sampler = ElasticSampler(list(range(10)), shuffle=False)
    assert list(sampler) == list(range(10))
    sampler.record_batch(0, 4)
    saved = sampler.state_dict()
    assert saved == {"epoch": 0, "processed_indices": {0, 1, 2, 3}}
    fresh = ElasticSampler(list(range(10)), shuffle=True, seed=3)
    fresh.load_state_dict(saved)
    assert sorted(fresh) == [4, 5, 6, 7, 8, 9] and len(fresh) == 6
    fresh.set_epoch(1)
    assert sorted(fresh) == list(range(10))
    assert torch is not None


def test_blacklist_cooldown_doubles_within_the_range():
    from fastps.launch.elastic_driver import _Blacklist

    forever = _Blacklist(None)
    assert forever.add("h", 0.0) == float("inf")
    assert forever.blocked("h", 1e9)
    cool = _Blacklist((1.0, 100.0))
    first = cool.add("h", 10.0)
    assert 2.0 <= first <= 3.0  # LO * 2 + up to LO
    assert cool.blocked("h", 10.0 + first - 0.01) and not cool.blocked("h", 10.0 + first)
    assert cool.add("h", 11.0) == pytest.approx(first - 1.0)  # still cooling: not extended
    second = cool.add("h", 20.0)
    assert 4.0 <= second <= 5.0
    capped = _Blacklist((1.0, 2.0))
    assert capped.add("h", 0.0) == 2.0 and not capped.blocked("other", 0.0)


def test_discovery_interval_from_the_environment():
    from fastps.launch.elastic_driver import (
        DISCOVERY_INTERVAL,
        MIN_DISCOVERY_INTERVAL,
        discovery_interval,
    )

    assert discovery_interval({}) == DISCOVERY_INTERVAL
    assert discovery_interval({"FASTPS_ELASTIC_DISCOVERY_INTERVAL": "0.3"}) == 0.3
    assert (
        discovery_interval({"FASTPS_ELASTIC_DISCOVERY_INTERVAL": "0.001"}) == MIN_DISCOVERY_INTERVAL
    )
    for bad in ("x", "0", "-1"):
        with pytest.raises(FastPSError, match="FASTPS_ELASTIC_DISCOVERY_INTERVAL"):
            discovery_interval({"FASTPS_ELASTIC_DISCOVERY_INTERVAL": bad})


def test_check_host_updates_drains_the_notification_queue():
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, epoch=0)
    state.on_hosts_updated(3, 2)
    state.on_hosts_updated(5, 1)
    state.check_host_updates()  # not an elastic worker: nothing to ask, nothing raised
    assert state._host_messages.empty() and state._last_updated_timestamp == 5
    state.on_hosts_updated(7, 2)
    state.on_reset()  # news of the old world is dropped
    assert state._host_messages.empty()


def _launcher(members, failed, spares, max_np=3):
    """An ElasticLauncher (no process started) whose generation was ``members``, with the
    slots in ``failed`` dead and ``spares`` waiting."""
    from fastps.launch.elastic_driver import ElasticLauncher, _Slot

    launcher = ElasticLauncher(
        ["true"], discovery_script="echo localhost:9", min_np=1, max_np=max_np
    )
    for seq, sid in enumerate([*members, *spares]):
        state = "failed" if sid in failed else "running"
        launcher.slots[sid] = _Slot(
            sid,
            "localhost",
            seq,
            None,
            state=state,
            ready=True,
            spare=sid in spares,  # type: ignore[arg-type]
        )
    launcher.members = list(members)
    launcher.waiting = {sid: 0.0 for sid in members if sid not in failed}
    launcher.waiting.update({sid: 0.0 for sid in spares})
    return launcher


def _seated(launcher):
    alive = [s for s in launcher.slots.values() if s.state == "running" and not s.spare]
    return [s.id for s in launcher._seat(alive)]


def test_a_spare_takes_the_failed_rank_but_never_rank_0():
    # rank 1 lost: the spare is rank 1, the others keep their ranks
    assert _seated(_launcher(["a", "b", "c"], {"b"}, ["s"])) == ["a", "s", "c"]
    # rank 0 lost: the survivors move up (rank 0 holds the committed state), the spare last
    assert _seated(_launcher(["a", "b", "c"], {"a"}, ["s"])) == ["b", "c", "s"]
    # two lost, one spare: the first hole is filled, the world is one smaller
    assert _seated(_launcher(["a", "b", "c"], {"b", "c"}, ["s"])) == ["a", "s"]
    # two spares, one lost: one is seated, the other stays a spare
    launcher = _launcher(["a", "b", "c"], {"c"}, ["s", "t"])
    assert _seated(launcher) == ["a", "b", "s"]
    assert launcher.slots["t"].spare and not launcher.slots["s"].spare
    # no room under --max-np: no spare is seated
    assert _seated(_launcher(["a", "b"], {"b"}, ["s"], max_np=1)) == ["a"]


def test_torch_state_rolls_back_to_the_same_commit_twice():
    """A restore must not hand the commit's own tensors to the optimizer: torch's
    load_state_dict keeps them, and the next steps update them in place, so a second
    failure before the next commit would roll back to a corrupted commit."""
    import copy

    torch = pytest.importorskip("torch")
    from fastps.torch.elastic import TorchState

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step() -> None:
        opt.zero_grad()
        model(torch.ones(2, 3)).pow(2).sum().backward()
        opt.step()

    step()  # the momentum buffers exist before the commit
    state = TorchState(model, opt, epoch=0)
    params = copy.deepcopy(model.state_dict())
    momenta = copy.deepcopy(opt.state_dict()["state"])
    for _ in range(2):  # a failure, two steps, another failure before any commit
        step()
        step()
        state.restore()
        for name, value in model.state_dict().items():
            assert torch.equal(value, params[name]), name
        for key, value in opt.state_dict()["state"].items():
            assert torch.equal(value["momentum_buffer"], momenta[key]["momentum_buffer"]), key


def _in_place(members, failed, spares, asked):
    """fastpsrun's in-place decision for the next generation (None: granted)."""
    launcher = _launcher(members, failed, spares)
    launcher.in_place_asks = set(asked)
    spare_ids = {s.id for s in launcher.slots.values() if s.spare}
    alive = [s for s in launcher.slots.values() if s.state == "running" and not s.spare]
    return launcher._in_place_refusal(launcher._seat(alive), spare_ids)


def test_in_place_is_granted_only_when_every_rank_stays():
    assert _in_place(["a", "b", "c"], {"b"}, ["s"], {"a", "c"}) is None
    # a survivor that applied an update asks for a rollback: everybody rolls back
    assert "rank 2 (slot c) asked for a rollback" in _in_place(["a", "b", "c"], {"b"}, ["s"], {"a"})
    # rank 0 lost: every rank moves
    assert "rank 0 was lost" in _in_place(["a", "b", "c"], {"a"}, ["s"], {"b", "c"})
    # no spare ready: the world shrinks
    assert "changes size (3 -> 2" in _in_place(["a", "b", "c"], {"b"}, [], {"a", "c"})
    # two lost, one spare
    assert "changes size" in _in_place(["a", "b", "c"], {"b", "c"}, ["s"], {"a"})


def test_in_place_window_closes_at_an_update_and_counts_other_collectives(monkeypatch):
    from fastps.elastic import inplace
    from fastps.worker import api

    class Session:
        submitted = 0

    session = Session()
    monkeypatch.setattr(api, "_state", session)
    monkeypatch.setenv(inplace.ENV, "1")
    monkeypatch.setattr(inplace.wire, "enabled", lambda: True)
    state = ObjectState(bcast_object=lambda o: o, get_rank=lambda: 0, step=0)
    inplace.enter(state, lambda: None)
    try:
        assert inplace.unsafe_reason() == "an update was applied since the last commit"
        inplace.opened()
        assert inplace.keeping() and inplace.unsafe_reason() is None
        session.submitted += 2  # the step's two gradients
        inplace.account(2)
        assert inplace.unsafe_reason() is None
        session.submitted += 1  # e.g. the program's allreduce of the loss
        assert "1 collective(s) other than this step's gradients" in inplace.unsafe_reason()
        inplace.opened()
        inplace.block("the gradient of 'emb' is sparse")
        assert not inplace.keeping()
        assert inplace.unsafe_reason() == "the gradient of 'emb' is sparse"
        inplace.opened()
        inplace.update_applied()
        assert not inplace.keeping()
        assert inplace.unsafe_reason() == "an update was applied since the last commit"
    finally:
        inplace.leave(state)
    assert inplace.unsafe_reason() == "not inside hvd.elastic.run"


def test_a_spare_takes_the_lost_ranks_shard_where_it_was():
    pytest.importorskip("torch")
    from fastps.torch.elastic import ElasticSampler

    def sampler(rank):
        s = ElasticSampler(range(40), seed=1)
        s.num_replicas, s.rank = 4, rank
        s.set_epoch(2)
        return s

    lost = sampler(1)
    for b in range(3):
        lost.record_batch(b, 2)
    commit = {**lost.state_dict(), **lost.position()}
    commit["processed_indices"] |= {i for r in (0, 2, 3) for i in sampler(r).indices[:6]}
    spare = sampler(1)
    spare.take_place(commit)
    assert list(spare) == lost.indices[6:]
    assert spare.get_indices(0, 2) == lost.get_indices(3, 2)
    assert len(spare) == len(lost.indices) - 6 and spare.consumed == 6
    assert spare.processed_indices == lost.processed_indices
    # what a rollback's sync does instead: re-shard what is left, another order
    resharded = sampler(1)
    resharded.load_state_dict(commit)
    assert list(resharded) != lost.indices[6:]
    # a later re-shard starts from everything processed, the lost rank's part included
    spare.record_batch(0, 2)
    spare.reset()
    assert spare.skip == 0 and spare.basis >= set(lost.indices[:8])


def test_in_place_mode_values(monkeypatch):
    from fastps.elastic import inplace

    monkeypatch.setattr(inplace.wire, "enabled", lambda: True)
    for value, want in (("0", ""), ("1", "commit"), ("on", "commit"), ("any", "any")):
        monkeypatch.setenv(inplace.ENV, value)
        assert inplace.mode() == want
    monkeypatch.setenv(inplace.ENV, "sometimes")
    with pytest.raises(FastPSError, match="FASTPS_ELASTIC_INPLACE='sometimes'"):
        inplace.mode()
    monkeypatch.setattr(inplace.wire, "enabled", lambda: False)  # not an elastic worker
    monkeypatch.setenv(inplace.ENV, "1")
    assert inplace.mode() == ""
