"""Topology-aware local aggregation plans (BytePS §4.2) on the paper's two machines."""

from __future__ import annotations

import pytest
from fastps.errors import FastPSError
from fastps.worker.topology import (
    HostTopology,
    choose_plan,
    from_env,
    parse_description,
    parse_nvidia_smi,
)

# Fig. 8: four PCIe switches with two GPUs each, NVLink between all GPUs, the NIC under the
# first switch (next to GPU0 and GPU1).
FIG8_SMI = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    NIC0    CPU Affinity
GPU0     X      NV1     NV1     NV2     NV2     NV1     NV1     NV2     PIX     0-23
GPU1    NV1      X      NV2     NV1     NV1     NV2     NV2     NV1     PIX     0-23
GPU2    NV1     NV2      X      NV2     NV1     NV1     NV2     NV1     SYS     0-23
GPU3    NV2     NV1     NV2      X      NV2     NV1     NV1     NV1     SYS     0-23
GPU4    NV2     NV1     NV1     NV2      X      NV1     NV1     NV2     SYS     24-47
GPU5    NV1     NV2     NV1     NV1     NV1      X      NV2     NV1     SYS     24-47
GPU6    NV1     NV2     NV2     NV1     NV1     NV2      X      NV1     SYS     24-47
GPU7    NV2     NV1     NV1     NV1     NV2     NV1     NV1      X      SYS     24-47
NIC0    PIX     PIX     SYS     SYS     SYS     SYS     SYS     SYS      X

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# Fig. 6: PCIe only, two switches of four GPUs; the NIC hangs off CPU0's own lanes.
FIG6_SMI = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    NIC0
GPU0     X      PIX     PIX     PIX     SYS     SYS     SYS     SYS     NODE
GPU1    PIX      X      PIX     PIX     SYS     SYS     SYS     SYS     NODE
GPU2    PIX     PIX      X      PIX     SYS     SYS     SYS     SYS     NODE
GPU3    PIX     PIX     PIX      X      SYS     SYS     SYS     SYS     NODE
GPU4    SYS     SYS     SYS     SYS      X      PIX     PIX     PIX     SYS
GPU5    SYS     SYS     SYS     SYS     PIX      X      PIX     PIX     SYS
GPU6    SYS     SYS     SYS     SYS     PIX     PIX      X      PIX     SYS
GPU7    SYS     SYS     SYS     SYS     PIX     PIX     PIX      X      SYS
NIC0    NODE    NODE    NODE    NODE    SYS     SYS     SYS     SYS      X
"""


def test_fig8_nvlink_reduces_to_a_root_off_the_nic_switch() -> None:
    topo = parse_nvidia_smi(FIG8_SMI)
    assert topo.nvlink
    assert topo.switches[topo.nic_switches[0]] == (0, 1)
    plan = choose_plan(topo)
    assert plan.strategy == "reduce_broadcast"
    assert plan.roots == [2]  # the paper's choice: GPU2, the first GPU away from the NIC
    assert plan.avoid_switches == list(topo.nic_switches)
    same = choose_plan(parse_description("switches=0,1|2,3|4,5|6,7;nic=0;nvlink=1"))
    assert same.strategy == "reduce_broadcast" and same.roots == [2]


def test_fig6_pcie_only_is_cpu_assisted_inside_each_switch() -> None:
    topo = parse_nvidia_smi(FIG6_SMI)
    assert not topo.nvlink and topo.switches == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert topo.nic_switches == ()
    plan = choose_plan(topo)
    assert plan.strategy == "cpu_assisted"
    assert plan.groups == [[0, 1, 2, 3], [4, 5, 6, 7]]  # never across switches
    assert sorted(plan.roots) == list(range(8))


def test_fig6_with_the_nic_under_one_switch_keeps_roots_away_from_it() -> None:
    plan = choose_plan(parse_description("switches=0,1,2,3|4,5,6,7;nic=0;nvlink=0"))
    assert plan.strategy == "cpu_assisted"
    assert plan.roots == [4, 5, 6, 7] and plan.avoid_switches == [0]
    assert all(set(g) <= {4, 5, 6, 7} for g in plan.groups)


def test_symmetric_nvlink_reduce_scatters_over_all_gpus() -> None:
    plan = choose_plan(HostTopology(((0, 1), (2, 3)), (0, 1), nvlink=True))
    assert plan.strategy == "reduce_scatter" and plan.groups == [[0, 1, 2, 3]]


def test_single_gpu_and_bad_descriptions() -> None:
    assert choose_plan(parse_description("switches=0;nic=0")).strategy == "single"
    assert from_env(None, None) is None
    for bad in ("nic=0", "switches=a,b", "switches=0,1;nic=3", "switches=0|0"):
        with pytest.raises(FastPSError):
            choose_plan(parse_description(bad))
    with pytest.raises(FastPSError):
        parse_nvidia_smi("no matrix here")
