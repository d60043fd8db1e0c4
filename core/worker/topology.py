"""Topology-aware local aggregation plan for a GPU host (BytePS §4.2).

A pure function chooses how the GPUs of one machine combine their gradients before the
communication service pushes them, following the paper's two principles (§4.2.3): never copy
directly between GPUs under different PCIe switches, and keep traffic off the PCIe uplink that
GPUs share with the NIC. With Sn switches holding GPUs and a NIC and Sg switches holding only
GPUs:

* Sn > 0 and Sg > 0 (asymmetric, e.g. Fig. 8 with NVLink): reduce to / broadcast from roots
  that are not under a NIC switch, so the NIC keeps its switch's uplink to itself. Without
  NVLink a cross-switch reduce would be slow, so each switch first reduce-scatters inside
  itself and the roots away from the NIC do the copy to host memory.
* otherwise (symmetric, e.g. Fig. 6 whose NIC has its own lanes): reduce-scatter and
  all-gather to balance every switch; without NVLink that is CPU-assisted aggregation
  (reduce-scatter inside each switch, copy to host memory, the CPU sums across switches).

The description comes from ``nvidia-smi topo -m`` output or from ``FASTPS_TOPOLOGY``, e.g.
``switches=0,1,2,3|4,5,6,7;nic=0;nvlink=0`` (switch index of the NIC, or ``nic=cpu`` for a NIC
on the CPU's own lanes). The plan is only chosen and reported: this build moves host memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fastps.errors import FastPSError

__all__ = [
    "HostTopology",
    "LocalPlan",
    "choose_plan",
    "parse_description",
    "parse_nvidia_smi",
    "from_env",
]


@dataclass(frozen=True)
class HostTopology:
    """GPUs grouped by the PCIe switch they hang off; which switches also carry a NIC."""

    switches: Tuple[Tuple[int, ...], ...]
    nic_switches: Tuple[int, ...] = ()  # indices into switches; empty: NIC on CPU lanes
    nvlink: bool = False  # every GPU pair is linked by NVLink

    @property
    def gpus(self) -> List[int]:
        return sorted(g for sw in self.switches for g in sw)


@dataclass(frozen=True)
class LocalPlan:
    strategy: str  # "single", "reduce_broadcast", "reduce_scatter", "cpu_assisted"
    groups: List[List[int]]  # GPUs that reduce-scatter / all-gather among themselves
    roots: List[int]  # GPUs that copy the local sum to host memory and back
    avoid_switches: List[int] = field(default_factory=list)  # uplinks kept for the NIC
    reason: str = ""

    def describe(self) -> str:
        return (
            f"{self.strategy}: groups {self.groups}, roots {self.roots}"
            + (
                f", keeping switch(es) {self.avoid_switches} free for the NIC"
                if self.avoid_switches
                else ""
            )
            + f" ({self.reason})"
        )


def choose_plan(topo: HostTopology) -> LocalPlan:
    """The paper's best-practice procedure (§4.2.3) as a pure function."""
    gpus = topo.gpus
    if len(gpus) != len(set(gpus)):
        raise FastPSError(f"a GPU appears under two PCIe switches: {topo.switches}")
    if len(gpus) <= 1:
        return LocalPlan("single", [gpus], gpus, [], "one GPU: nothing to aggregate locally")
    with_gpus = [i for i, sw in enumerate(topo.switches) if sw]
    sn = [i for i in with_gpus if i in topo.nic_switches]
    sg = [i for i in with_gpus if i not in topo.nic_switches]
    if sn and sg:
        away = [g for i in sg for g in sorted(topo.switches[i])]
        if topo.nvlink:
            root = away[0]
            return LocalPlan(
                "reduce_broadcast",
                [gpus],
                [root],
                sn,
                f"asymmetric (Sn={len(sn)}, Sg={len(sg)}) with NVLink: reduce every GPU into "
                f"GPU{root} over NVLink, which alone copies to and from host memory through a "
                "switch without the NIC",
            )
        return LocalPlan(
            "cpu_assisted",
            [sorted(topo.switches[i]) for i in sg],
            away,
            sn,
            f"asymmetric (Sn={len(sn)}, Sg={len(sg)}) without NVLink: reduce-scatter inside "
            "each switch without the NIC, those GPUs copy to host memory where the CPU sums; "
            "the NIC's switch is left to the NIC and its GPUs copy straight to host memory",
        )
    if topo.nvlink:
        return LocalPlan(
            "reduce_scatter",
            [gpus],
            gpus,
            [],
            "symmetric with NVLink: reduce-scatter / all-gather over NVLink, every GPU copies "
            "its share to host memory",
        )
    return LocalPlan(
        "cpu_assisted",
        [sorted(topo.switches[i]) for i in with_gpus],
        gpus,
        [],
        f"symmetric PCIe-only ({len(with_gpus)} switches): reduce-scatter inside each switch, "
        "copy to host memory, the CPU sums across switches (no cross-switch GPU copy)",
    )


def parse_description(text: str) -> HostTopology:
    """``switches=0,1|2,3;nic=0;nvlink=1`` -> HostTopology."""
    fields: Dict[str, str] = {}
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise FastPSError(f"invalid FASTPS_TOPOLOGY item {item!r}: expected key=value")
        fields[key.strip().lower()] = value.strip()
    if "switches" not in fields:
        raise FastPSError("FASTPS_TOPOLOGY needs switches=..., e.g. switches=0,1|2,3;nic=0")
    try:
        switches = tuple(
            tuple(int(g) for g in grp.split(",") if g.strip())
            for grp in fields["switches"].split("|")
        )
        nic_text = fields.get("nic", "cpu").lower()
        nics = () if nic_text in ("", "cpu", "none") else tuple(int(x) for x in nic_text.split(","))
    except ValueError:
        raise FastPSError(
            f"invalid FASTPS_TOPOLOGY {text!r}: GPU and switch numbers must be integers"
        ) from None
    for n in nics:
        if not 0 <= n < len(switches):
            raise FastPSError(
                f"FASTPS_TOPOLOGY: nic={n} is not a switch index (0..{len(switches) - 1})"
            )
    nvlink = fields.get("nvlink", "0").lower() in ("1", "true", "yes", "on")
    return HostTopology(switches, nics, nvlink)


_SAME_SWITCH = {"PIX", "PXB"}


def parse_nvidia_smi(text: str) -> HostTopology:
    """Reads the matrix printed by ``nvidia-smi topo -m``."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    header: Optional[List[str]] = None
    rows: Dict[str, List[str]] = {}
    for ln in lines:
        cols = ln.split()
        if header is None:
            if cols and cols[0].startswith("GPU"):
                header = [c for c in cols if re.fullmatch(r"(GPU|NIC|mlx)\w*", c)]
            continue
        if cols and re.fullmatch(r"(GPU\d+|NIC\d+|mlx\w+)", cols[0]):
            rows[cols[0]] = cols[1 : 1 + len(header)]
    if not header:
        raise FastPSError("not nvidia-smi topo -m output: no GPU header row")
    gpus = [h for h in header if h.startswith("GPU")]
    nics = [h for h in header if not h.startswith("GPU")]
    idx = {h: i for i, h in enumerate(header)}

    def link(a: str, b: str) -> str:
        return rows.get(a, [])[idx[b]] if b in idx and len(rows.get(a, [])) > idx[b] else ""

    parent = {g: g for g in gpus}

    def find(g: str) -> str:
        while parent[g] != g:
            g = parent[g]
        return g

    for a in gpus:
        for b in gpus:
            if a < b and link(a, b) in _SAME_SWITCH:
                parent[find(a)] = find(b)
    # GPUs that share a NIC's switch belong together too (NVLink hides GPU-GPU PCIe links).
    nic_groups = []
    for n in nics:
        close = [g for g in gpus if link(g, n) in _SAME_SWITCH]
        for g in close[1:]:
            parent[find(g)] = find(close[0])
        if close:
            nic_groups.append(find(close[0]))
    groups: Dict[str, List[int]] = {}
    for g in gpus:
        groups.setdefault(find(g), []).append(int(g[3:]))
    order = sorted(groups, key=lambda k: min(groups[k]))
    switches = tuple(tuple(sorted(groups[k])) for k in order)
    nic_idx = tuple(
        sorted(
            {
                order.index(find_root)
                for find_root in (find(f"GPU{groups[r][0]}") for r in nic_groups)
            }
        )
    )
    nvlink = len(gpus) > 1 and all(
        link(a, b).startswith("NV") for a in gpus for b in gpus if a != b
    )
    return HostTopology(switches, nic_idx, nvlink)


def from_env(env_text: Optional[str], smi_text: Optional[str] = None) -> Optional[LocalPlan]:
    """The plan for this host: FASTPS_TOPOLOGY if set, else nvidia-smi's matrix if given."""
    if env_text:
        return choose_plan(parse_description(env_text))
    if smi_text:
        return choose_plan(parse_nvidia_smi(smi_text))
    return None


def _smi_text() -> Optional[str]:  # pragma: no cover - needs a GPU host
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        return subprocess.run(
            [exe, "topo", "-m"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def host_plan(env_text: Optional[str]) -> Optional[LocalPlan]:
    """Plan from FASTPS_TOPOLOGY, else from nvidia-smi on this machine; None without GPUs."""
    return from_env(env_text, None if env_text else _smi_text())
