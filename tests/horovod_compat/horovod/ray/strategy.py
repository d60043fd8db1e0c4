"""``horovod.ray.strategy``: only ``create_placement_group``, which Horovod's test uses to
run the executor inside a placement group of its own (which fastps's executor then uses:
``use_current_placement_group``). fastps.ray has no such helper; this is plain Ray:
``num_bundles`` bundles of ``resources_per_bundle`` with ``pg_strategy``, ready within
``pg_timeout`` seconds, else ``TimeoutError``. Returns the group and its bundles."""

from typing import Any, Dict, List, Tuple


def create_placement_group(
    resources_per_bundle: Dict[str, float], num_bundles: int, pg_timeout: float, pg_strategy: str
) -> Tuple[Any, List[Dict[str, float]]]:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [dict(resources_per_bundle) for _ in range(num_bundles)]
    pg = placement_group(bundles, strategy=pg_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=pg_timeout)
    if not ready:
        remove_placement_group(pg)
        raise TimeoutError(f"placement group {bundles} not ready within {pg_timeout} s")
    return pg, bundles
