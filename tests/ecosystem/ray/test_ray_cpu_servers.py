"""RayExecutor on a real two-node Ray cluster (both nodes on this machine): summation servers
on a CPU-only node (``num_cpu_servers``, ``cpu_server_resource``), and an executor started
inside a placement group that uses that group (``use_current_placement_group``).

The cluster: a head node of 2 CPUs, where the workers go, and a node of 1 CPU marked with
the custom resource ``fastps_cpu_server``, which holds no worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator

import pytest
import ray_jobs
from conftest import worker_path

pytestmark = pytest.mark.timeout(240)

RESOURCE = "fastps_cpu_server"


@dataclass(frozen=True)
class TwoNodes:
    head: str  # Ray node ids
    cpu_only: str


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()  # the tier's one-node cluster, if a test before used it
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False},
    )
    try:
        cpu_node = cluster.add_node(num_cpus=1, resources={RESOURCE: 1})
        ray.init(
            address=cluster.address,
            log_to_driver=True,
            runtime_env={"env_vars": {"PYTHONPATH": worker_path(), "OMP_NUM_THREADS": "1"}},
        )
        cluster.wait_for_nodes(timeout=60)
        yield TwoNodes(head=cluster.head_node.node_id, cpu_only=cpu_node.node_id)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _groups() -> Dict[str, str]:
    """Every placement group of the cluster: id -> state."""
    import ray

    return {pg_id: g["state"] for pg_id, g in ray.util.placement_group_table().items()}


def test_placement_rules() -> None:
    """The pure rules (no Ray): what a caller's group holds; which nodes take CPU servers."""
    from fastps.errors import FastPSError
    from fastps.launch.ray.placement import cpu_server_nodes, workers_fitting

    assert workers_fitting([{"CPU": 1}] * 4, 1, 0) == 4
    assert workers_fitting([{"CPU": 2.0, "GPU": 1}], 1, 1) == 1
    assert workers_fitting([{"CPU": 0.9}], 0.3, 0) == 3

    def node(i: int, **res: float) -> Dict[str, Any]:
        return {
            "NodeID": f"n{i}",
            "Alive": True,
            "NodeManagerAddress": f"10.0.0.{i}",
            "Resources": res,
        }

    nodes = [node(1, CPU=8), node(3, CPU=4, srv=1), node(2, CPU=4, srv=1), node(4, CPU=0.5, srv=1)]
    assert cpu_server_nodes(nodes, {"n1"}, 2, "srv", 1) == ["n2", "n3"]  # address order
    assert cpu_server_nodes(nodes, {"n1"}, 3, None, 0.5) == ["n2", "n3", "n4"]
    assert cpu_server_nodes(nodes, {"n1"}, 0, None, 1) == []
    with pytest.raises(FastPSError, match=r"num_cpu_servers=3, but only 2 .*'srv'"):
        cpu_server_nodes(nodes, {"n1"}, 3, "srv", 1)  # n4 has too few CPUs
    with pytest.raises(FastPSError, match=r"num_cpu_servers=1, but only 0 .*without workers"):
        cpu_server_nodes(nodes[:1], {"n1"}, 1, None, 1)
    with pytest.raises(FastPSError, match=r"cpu_server_resource='nope', but no alive"):
        cpu_server_nodes(nodes, set(), 1, "nope", 1)


def test_cpu_server_on_cpu_only_node_sums_exactly_and_trains(two_nodes: TwoNodes) -> None:
    import ray
    from fastps.ray import RayExecutor
    from ray_digits import train_digits

    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
    executor = RayExecutor(
        settings,
        num_hosts=1,
        num_workers_per_host=2,  # one bundle of 2 CPUs: only the head node holds it
        num_cpu_servers=1,
        cpu_server_resource=RESOURCE,
    )
    began = time.monotonic()
    executor.start()
    started_s = time.monotonic() - began
    try:
        nodes = ray.get([w.node_id.remote() for w in executor.workers], timeout=30)
        assert nodes == [two_nodes.head] * 2
        servers = executor.server_placements()
        assert [(s["server_id"], s["node_id"], s["cpu_only"]) for s in servers] == [
            (0, two_nodes.head, False),  # the worker node's own server
            (1, two_nodes.cpu_only, True),  # the CPU-only node's
        ]
        assert ray.available_resources().get(RESOURCE, 0.0) == 0.0  # the server holds it
        out = executor.run(ray_jobs.exact_sums, args=[1 << 20])  # 4 MiB per tensor
        assert [r["rank"] for r in out] == [0, 1]
        assert all(r["exact"] for r in out), out
        assert [r["num_servers"] for r in out] == [2, 2]
        # Both servers sum a share of every tensor's bytes.
        assert all(len(r["server_weights"]) == 2 and min(r["server_weights"]) > 0 for r in out)
        sums_s = time.monotonic() - began

        digits = executor.run(train_digits, kwargs={"epochs": 15})
        digits_s = time.monotonic() - began - sums_s
    finally:
        executor.shutdown()
    stopped_s = time.monotonic() - began - sums_s - digits_s
    single = train_digits(epochs=15)  # no job: one process
    assert digits[0]["accuracy"] == digits[1]["accuracy"]
    assert digits[0]["accuracy"] >= single["accuracy"] - 0.02, (digits, single)
    assert digits[0]["accuracy"] >= 0.93
    # The CPU server's resource is free again: the executor's actors are gone.
    assert _wait_free(RESOURCE, 1.0)
    print(
        f"\nCPU server: start {started_s:.1f} s, + exact sums {sums_s:.1f} s, digits "
        f"{digits_s:.1f} s, shutdown {stopped_s:.1f} s; digits 2 workers + 2 servers "
        f"{digits[0]['accuracy']:.4f}, single process {single['accuracy']:.4f}"
    )


def _wait_free(resource: str, amount: float, within: float = 20.0) -> bool:
    import ray

    deadline = time.monotonic() + within
    while ray.available_resources().get(resource, 0.0) < amount:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_bad_cpu_server_requests_fail_fast_and_clearly(two_nodes: TwoNodes) -> None:
    import ray
    from fastps.errors import FastPSError
    from fastps.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=8, placement_group_timeout_s=2)
    with pytest.raises(FastPSError, match=r"num_cpu_servers=-1"):
        RayExecutor(settings, num_workers=1, num_cpu_servers=-1)
    with pytest.raises(FastPSError, match=r"cpu_server_resource='CPU'"):
        RayExecutor(settings, num_workers=1, num_cpu_servers=1, cpu_server_resource="CPU")
    with pytest.raises(FastPSError, match=r"cpu_server_resource='x' without num_cpu_servers"):
        RayExecutor(settings, num_workers=1, cpu_server_resource="x")
    with pytest.raises(FastPSError, match=r"num_cpu_servers=1 is for the fixed form"):
        RayExecutor(settings, min_workers=1, num_cpu_servers=1)

    groups = _groups()
    cases = [
        # More CPU servers than marked nodes: refused before anything is reserved.
        (dict(num_workers=1, num_cpu_servers=2, cpu_server_resource=RESOURCE),
         rf"num_cpu_servers=2, but only 1 alive Ray node with resource '{RESOURCE}'"),
        # No node has the resource.
        (dict(num_workers=1, num_cpu_servers=1, cpu_server_resource="fastps_nowhere"),
         r"cpu_server_resource='fastps_nowhere', but no alive Ray node"),
        # A worker on each node: no node is left for a CPU server (found once placed).
        (dict(num_hosts=2, num_workers_per_host=1, num_cpu_servers=1),
         r"num_cpu_servers=1, but only 0 alive Ray node without workers"),
    ]  # fmt: skip
    for kwargs, message in cases:
        began = time.monotonic()
        with pytest.raises(FastPSError, match=message):
            RayExecutor(settings, **kwargs).start()
        assert time.monotonic() - began < 30, kwargs

    # The marked node's resource held by other work: start() gives up, never hangs.
    holder = ray.remote(num_cpus=0, resources={RESOURCE: 1})(ray_jobs.Holder).remote()
    try:
        ray.get(holder.ready.remote(), timeout=60)
        executor = RayExecutor(  # a worker of 2 CPUs: only the head node holds it
            settings,
            num_workers=1,
            cpus_per_worker=2,
            num_cpu_servers=1,
            cpu_server_resource=RESOURCE,
        )
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"server actors did not start .*fastps_cpu_server"):
            executor.start()
        assert time.monotonic() - began < 30
    finally:
        ray.kill(holder)
    # Every failed start() removed the group it had reserved.
    assert _wait_groups_removed(groups)


def _wait_groups_removed(before: Dict[str, str], within: float = 20.0) -> bool:
    """Whether every group made since ``before`` is REMOVED (soon)."""
    deadline = time.monotonic() + within
    while True:
        new = {k: v for k, v in _groups().items() if k not in before}
        if all(v == "REMOVED" for v in new.values()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def test_executor_in_a_placement_group_uses_it(two_nodes: TwoNodes) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    groups_before = {k for k, v in _groups().items() if v != "REMOVED"}
    pg = placement_group([{"CPU": 2}])  # one bundle: only the head node holds it
    ready, _ = ray.wait([pg.ready()], timeout=60)
    assert ready
    driver_cls = ray.remote(num_cpus=0)(ray_jobs.ExecutorInPlacementGroup)
    driver = driver_cls.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_capture_child_tasks=True
        )
    ).remote()
    try:
        # More workers than the group holds (2 of 1 CPU): a clear error at once, no wait.
        too_many = ray.get(driver.run.remote(3, 0, ""), timeout=120)
        assert "holds 2 workers of 1 CPUs and 0 GPUs, not 3" in too_many["error"], too_many
        assert "use_current_placement_group=False" in too_many["error"]

        out = ray.get(driver.run.remote(2, 1, RESOURCE), timeout=180)
        assert "error" not in out, out
        assert out["current_pg"] == pg.id.hex() == out["used_pg"]
        assert out["created_placement_group"] is False
        # Only the test's group (and none of its own) existed while the executor ran.
        assert sorted(out["groups_while_running"]) == sorted(groups_before | {pg.id.hex()})
        assert out["workers"] == [two_nodes.head] * 2  # where the group's bundles are
        assert [(r["rank"], r["exact"], r["num_servers"]) for r in out["sums"]] == [
            (0, True, 2),
            (1, True, 2),
        ]
        # The CPU server went to the marked node, outside the caller's group.
        assert [(s["node_id"], s["cpu_only"]) for s in out["servers"]] == [
            (two_nodes.head, False),
            (two_nodes.cpu_only, True),
        ]
        # The executor's shutdown() left the caller's group alone.
        assert _groups()[pg.id.hex()] == "CREATED"
    finally:
        ray.kill(driver)
        remove_placement_group(pg)
