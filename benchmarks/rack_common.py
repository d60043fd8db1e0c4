"""Shared pieces of the emulated-rack benchmarks (comm_rack.py, train_rack.py, plot_rack.py).

- gradient sets of real models (VGG-16, ResNet-50) as (name, shape) lists, in forward order;
- the performance model of docs/design/rationale.md (BytePS Eq. 6 and ring all-reduce);
- starting fastps (scheduler, servers, workers), torch.distributed Gloo and MXNet's
  dist_sync KVStore on the hosts of a :class:`benchmarks.rack.Rack`, and the Gloo peer's
  own start from its environment (:func:`init_gloo_from_env`, also used on loopback);
- ``RESULT {json}`` lines from child processes and CSV files with a provenance header.

The topology follows BytePS: one summation server on every worker host (w0..w{n-1}) plus one
on each CPU host (c0..c{k-1}); the scheduler runs on w0. Every process sees its own host's
address (FASTPS_HOST) and name (FASTPS_HOSTNAME), so fastps can tell colocated servers
from CPU-only ones.

This module imports only the standard library at the top: the child processes of the MXNet
peer run in another interpreter (the MXNet venv) and import it too.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "docs" / "results"
RESULT_TAG = "RESULT "

# One TCP stream at MTU 1500 carries 1448 payload bytes per 1514-byte frame on the wire
# (docs/design/rack.md): the goodput ceiling of a link shaped at `rate`.
GOODPUT_FACTOR = 0.956

Shape = Tuple[int, ...]

# ----------------------------------------------------------------------------- models


def vgg16_shapes(num_classes: int = 1000) -> List[Tuple[str, Shape]]:
    """Trainable tensors of VGG-16 (configuration D, 224x224 input), forward order."""
    plan: List[Any] = [
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        "M",
    ]
    out: List[Tuple[str, Shape]] = []
    cin = 3
    idx = 0
    for item in plan:
        if item == "M":
            idx += 1
            continue
        cout = int(item)
        out.append((f"features.{idx}.weight", (cout, cin, 3, 3)))
        out.append((f"features.{idx}.bias", (cout,)))
        cin = cout
        idx += 2  # conv, relu
    dims = [512 * 7 * 7, 4096, 4096, num_classes]
    for i in range(3):
        out.append((f"classifier.{3 * i}.weight", (dims[i + 1], dims[i])))
        out.append((f"classifier.{3 * i}.bias", (dims[i + 1],)))
    return out


def resnet50_shapes(num_classes: int = 1000) -> List[Tuple[str, Shape]]:
    """Trainable tensors of ResNet-50 (bottleneck blocks 3-4-6-3), forward order.

    Batch-norm scale and shift are trainable (they get gradients); running statistics are
    buffers and are not synchronised.
    """
    out: List[Tuple[str, Shape]] = [
        ("conv1.weight", (64, 3, 7, 7)),
        ("bn1.weight", (64,)),
        ("bn1.bias", (64,)),
    ]
    inplanes = 64
    for stage, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), 1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            out.append((f"{p}.conv1.weight", (planes, inplanes, 1, 1)))
            out += [(f"{p}.bn1.weight", (planes,)), (f"{p}.bn1.bias", (planes,))]
            out.append((f"{p}.conv2.weight", (planes, planes, 3, 3)))
            out += [(f"{p}.bn2.weight", (planes,)), (f"{p}.bn2.bias", (planes,))]
            out.append((f"{p}.conv3.weight", (planes * 4, planes, 1, 1)))
            out += [(f"{p}.bn3.weight", (planes * 4,)), (f"{p}.bn3.bias", (planes * 4,))]
            if b == 0:
                out.append((f"{p}.downsample.0.weight", (planes * 4, inplanes, 1, 1)))
                out += [
                    (f"{p}.downsample.1.weight", (planes * 4,)),
                    (f"{p}.downsample.1.bias", (planes * 4,)),
                ]
            inplanes = planes * 4
    out += [("fc.weight", (num_classes, 2048)), ("fc.bias", (num_classes,))]
    return out


MODELS = {"resnet50": resnet50_shapes, "vgg16": vgg16_shapes}


def numel(shape: Iterable[int]) -> int:
    return int(math.prod(shape))


def gradient_sizes(model: str, scale: float = 1.0) -> List[Tuple[str, int]]:
    """(name, element count) of every gradient tensor of ``model``, forward order.

    ``scale`` < 1 shrinks every tensor to that fraction (at least one element), keeping the
    number of tensors and their relative sizes: a cheaper run of the same gradient set.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {sorted(MODELS)}")
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    return [(name, max(1, int(round(numel(shape) * scale)))) for name, shape in MODELS[model]()]


def gradient_shapes(model: str, scale: float = 1.0) -> List[Tuple[str, Shape]]:
    """(name, shape) of every gradient tensor of ``model``, forward order.

    ``scale`` < 1 shrinks every tensor to about that fraction and keeps it a tensor of the
    same rank: a weight's first two dimensions (the matrix PowerSGD sees: first dimension
    × the rest) by √scale each, kernel dimensions kept, a vector by scale; at least 1
    each. For comparisons where the shape matters (low-rank compression); at scale 1 the
    model's own shapes.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {sorted(MODELS)}")
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    side = math.sqrt(scale)
    out: List[Tuple[str, Shape]] = []
    for name, shape in MODELS[model]():
        if scale == 1:
            out.append((name, shape))
        elif len(shape) == 1:
            out.append((name, (max(1, round(shape[0] * scale)),)))
        else:
            lead = tuple(max(1, round(d * side)) for d in shape[:2])
            out.append((name, lead + tuple(shape[2:])))
    return out


# ----------------------------------------------------------------------------- bounds


def fastps_bound_s(n: int, k: int, model_bytes: float, goodput_bytes_s: float) -> float:
    """BytePS Eq. 6: 2n(n-1)M / ((n^2 + kn - 2k) B); M/B for k >= n (plain PS).

    n=1 moves nothing over the network (0 s).
    """
    if n < 1 or k < 0:
        raise ValueError("need n >= 1 and k >= 0")
    if n == 1:
        return 0.0
    if k >= n:
        return model_bytes / goodput_bytes_s
    return 2 * n * (n - 1) * model_bytes / ((n * n + k * n - 2 * k) * goodput_bytes_s)


def allreduce_bound_s(n: int, model_bytes: float, goodput_bytes_s: float) -> float:
    """Ring all-reduce: 2(n-1)M / (nB)."""
    return 2 * (n - 1) * model_bytes / (n * goodput_bytes_s)


# ----------------------------------------------------------------------------- provenance


def git_commit() -> str:
    try:
        res = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        head = res.stdout.strip() or "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(argv: Optional[Sequence[str]] = None) -> Dict[str, str]:
    args = list(sys.argv if argv is None else argv)
    if args and args[0].endswith(".py"):
        args[0] = os.path.relpath(args[0], REPO)
    return {
        "command": "python -m " + module_name(args[0]) + " " + " ".join(args[1:])
        if args and args[0].endswith(".py")
        else " ".join(args),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "machine": f"{os.cpu_count()} CPUs, {_mem_gib():.0f} GiB RAM, {os.uname().release}",
        "load_at_start": load_text(),
    }


def load_text() -> str:
    """1/5/15-minute load averages: the cores are shared with anything else running."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def module_name(path: str) -> str:
    rel = Path(path)
    if rel.is_absolute():
        rel = rel.relative_to(REPO)
    return ".".join(rel.with_suffix("").parts)


def _mem_gib() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def write_csv(
    path: Path, rows: Sequence[Mapping[str, Any]], fields: Sequence[str], meta: Mapping[str, str]
) -> None:
    """CSV with ``# key: value`` provenance lines first (read back by :func:`read_csv`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        for key, value in meta.items():
            fh.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({f: _fmt(row.get(f, "")) for f in fields})
    os.replace(tmp, path)


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def read_csv(path: Path) -> Tuple[Dict[str, str], List[Dict[str, str]]]:
    meta: Dict[str, str] = {}
    lines: List[str] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("# ") and not lines:
                key, _, value = line[2:].partition(":")
                meta[key.strip()] = value.strip()
            else:
                lines.append(line)
    return meta, list(csv.DictReader(lines))


def csv_number(value: Any) -> Optional[float]:
    """A cell read back from one of these CSVs as a float; None for an empty or
    non-numeric cell (a run that failed leaves its columns empty or says why)."""
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------- child results


def emit_result(payload: Mapping[str, Any], rank: int) -> None:
    """A child's way to hand a measurement to the orchestrator.

    Written to ``$RACK_RESULT_DIR/rank<rank>.json`` (the namespaces share the file system)
    and printed as a ``RESULT {json}`` line for the log.
    """
    text = json.dumps(payload, sort_keys=True)
    out_dir = os.environ.get("RACK_RESULT_DIR")
    if out_dir:
        path = Path(out_dir) / f"rank{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    print(RESULT_TAG + text, flush=True)


def read_results(out_dir: Path) -> Dict[int, Dict[str, Any]]:
    """rank -> payload of every result file in ``out_dir``."""
    found: Dict[int, Dict[str, Any]] = {}
    for path in sorted(Path(out_dir).glob("rank*.json")):
        try:
            found[int(path.stem[4:])] = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            continue
    return found


# ----------------------------------------------------------------------------- launching

# Every process of a benchmark is pinned to one thread of math: n workers plus n+k servers
# share the machine's cores, and oversubscribed OpenMP pools only add noise.
QUIET_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@dataclass
class Launch:
    """The processes of one system on the rack, ready for ``rack.run_all``."""

    procs: List[Any] = field(default_factory=list)  # subprocess.Popen


def _cpu_hosts(rack: Any, k: int) -> List[Any]:
    if k > len(rack.cpu_hosts):
        raise ValueError(f"k={k} CPU hosts requested, rack has {len(rack.cpu_hosts)}")
    return list(rack.cpu_hosts[:k])


def start_fastps(
    rack: Any,
    n: int,
    k: int,
    worker_argv: Sequence[str],
    port: int,
    extra_env: Optional[Mapping[str, str]] = None,
    timeout_s: float = 120.0,
    label: str = "fastps",
    servers_on_workers: bool = True,
) -> Launch:
    """Scheduler on w0, servers on w0..w{n-1} (unless ``servers_on_workers`` is False) and
    c0..c{k-1}, one worker per worker host."""
    workers = list(rack.workers[:n])
    if len(workers) < n:
        raise ValueError(f"n={n} worker hosts requested, rack has {len(rack.workers)}")
    server_hosts = (workers if servers_on_workers else []) + _cpu_hosts(rack, k)
    if not server_hosts:
        raise ValueError("no server host: give k >= 1 CPU hosts or servers on the workers")
    job = {
        "FASTPS_SCHEDULER_ADDR": f"{workers[0].addr}:{port}",
        "FASTPS_JOB_ID": f"rack-{label}-{port}",
        "FASTPS_TOKEN": secrets.token_hex(16),
        "FASTPS_NUM_WORKERS": str(n),
        "FASTPS_NUM_SERVERS": str(len(server_hosts)),
        "FASTPS_TIMEOUT": str(int(timeout_s)),
        "FASTPS_OP_TIMEOUT": str(int(timeout_s)),
        "FASTPS_LOG_LEVEL": "WARNING",
        **QUIET_THREADS,
        **(extra_env or {}),
    }
    py = sys.executable
    launch = Launch()
    launch.procs.append(
        rack.spawn(
            workers[0],
            [py, "-m", "fastps.scheduler"],
            env={**job, "FASTPS_ROLE": "scheduler"},
            cwd=str(REPO),
            label=f"{label}-sched",
        )
    )
    for sid, host in enumerate(server_hosts):
        launch.procs.append(
            rack.spawn(
                host,
                [py, "-m", "fastps.server"],
                env={**job, "FASTPS_ROLE": "server", "FASTPS_SERVER_ID": str(sid)},
                cwd=str(REPO),
                label=f"{label}-s{sid}",
            )
        )
    for rank, host in enumerate(workers):
        launch.procs.append(
            rack.spawn(
                host,
                list(worker_argv),
                env={**job, "FASTPS_ROLE": "worker", "FASTPS_RANK": str(rank)},
                cwd=str(REPO),
                label=f"{label}-w{rank}",
            )
        )
    return launch


def start_gloo(
    rack: Any,
    n: int,
    worker_argv: Sequence[str],
    port: int,
    extra_env: Optional[Mapping[str, str]] = None,
    label: str = "gloo",
) -> Launch:
    """One torch.distributed (Gloo) process per worker host; the TCP store on w0."""
    workers = list(rack.workers[:n])
    launch = Launch()
    for rank, host in enumerate(workers):
        env = {
            "MASTER_ADDR": workers[0].addr,
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": "0",
            "GLOO_SOCKET_IFNAME": "eth0",
            **QUIET_THREADS,
            **(extra_env or {}),
        }
        launch.procs.append(
            rack.spawn(host, list(worker_argv), env=env, cwd=str(REPO), label=f"{label}-w{rank}")
        )
    return launch


def start_torch_fastps(
    rack: Any,
    n: int,
    k: int,
    worker_argv: Sequence[str],
    port: int,
    extra_env: Optional[Mapping[str, str]] = None,
    timeout_s: float = 120.0,
    label: str = "torchfps",
) -> Launch:
    """torch.distributed on the fastps backend, started as torchrun would: one process per
    worker host with Gloo's variables (:func:`start_gloo`; the store on w0). Rank 0 runs
    the scheduler, the first rank on each host starts that host's server (the host's
    FASTPS_HOSTNAME and FASTPS_HOST come from ``rack.spawn``); with ``k`` > 0 the workers
    wait for k CPU servers (FASTPS_CPU_SERVERS) and c0..c{k-1} each run ``python -m
    fastps.server --join <w0>:<port>``."""
    workers = list(rack.workers[:n])
    cpu_hosts = _cpu_hosts(rack, k)
    common = {
        "FASTPS_TIMEOUT": str(int(timeout_s)),
        "FASTPS_OP_TIMEOUT": str(int(timeout_s)),
        "FASTPS_LOG_LEVEL": "WARNING",
        **QUIET_THREADS,
        **(extra_env or {}),
    }
    launch = start_gloo(
        rack, n, worker_argv, port, {**common, "FASTPS_CPU_SERVERS": str(k)}, label=label
    )
    join = [sys.executable, "-m", "fastps.server", "--join", f"{workers[0].addr}:{port}"]
    for i, host in enumerate(cpu_hosts):
        launch.procs.append(
            rack.spawn(host, join, env=common, cwd=str(REPO), label=f"{label}-c{i}")
        )
    return launch


GLOO_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def init_gloo_from_env(timeout_s: float) -> Tuple[int, int]:
    """The Gloo peer's side of :func:`start_gloo` (and of the loopback launchers that set the
    same variables): joins torch.distributed's Gloo group through the TCP store at
    MASTER_ADDR:MASTER_PORT as RANK of WORLD_SIZE, every collective bounded by ``timeout_s``.
    Returns (rank, world size)."""
    import torch.distributed as dist

    missing = [k for k in GLOO_ENV if not os.environ.get(k)]
    if missing:
        raise RuntimeError(f"the Gloo peer needs {', '.join(missing)} in its environment")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return rank, world


def start_mxnet(
    rack: Any,
    n: int,
    k: int,
    python: str,
    worker_argv: Sequence[str],
    port: int,
    extra_env: Optional[Mapping[str, str]] = None,
    label: str = "mxnet",
) -> Launch:
    """MXNet dist_sync KVStore: ps-lite scheduler on w0, servers where fastps has them."""
    workers = list(rack.workers[:n])
    server_hosts = workers + _cpu_hosts(rack, k)
    common = {
        "DMLC_PS_ROOT_URI": workers[0].addr,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_WORKER": str(n),
        "DMLC_NUM_SERVER": str(len(server_hosts)),
        "DMLC_INTERFACE": "eth0",
        "PS_VERBOSE": "0",
        # Servers only sum (no optimizer); let them use more than one thread for it.
        "MXNET_KVSTORE_REDUCTION_NTHREADS": "1",
        **QUIET_THREADS,
        **(extra_env or {}),
    }
    # The venv interpreter must not see this interpreter's site-packages.
    clean = {"PYTHONPATH": str(REPO), "PYTHONNOUSERSITE": "1"}
    server_cmd = [python, "-c", "import mxnet"]  # importing mxnet runs the role's loop
    launch = Launch()
    launch.procs.append(
        rack.spawn(
            workers[0],
            server_cmd,
            env={**common, **clean, "DMLC_ROLE": "scheduler", "DMLC_NODE_HOST": workers[0].addr},
            cwd=str(REPO),
            label=f"{label}-sched",
        )
    )
    for sid, host in enumerate(server_hosts):
        launch.procs.append(
            rack.spawn(
                host,
                server_cmd,
                env={**common, **clean, "DMLC_ROLE": "server", "DMLC_NODE_HOST": host.addr},
                cwd=str(REPO),
                label=f"{label}-s{sid}",
            )
        )
    for rank, host in enumerate(workers):
        launch.procs.append(
            rack.spawn(
                host,
                list(worker_argv),
                env={
                    **common,
                    **clean,
                    "DMLC_ROLE": "worker",
                    "DMLC_NODE_HOST": host.addr,
                    "RACK_RANK_HINT": str(rank),
                },
                cwd=str(REPO),
                label=f"{label}-w{rank}",
            )
        )
    return launch


def mxnet_python() -> Tuple[Optional[str], str]:
    """(interpreter of the MXNet venv, why not) — via tests/envs/mxnet.sh, else .venv-mxnet."""
    candidates: List[str] = []
    script = REPO / "tests" / "envs" / "mxnet.sh"
    if script.exists():
        try:
            res = subprocess.run(
                ["bash", str(script)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
            if res.returncode == 0 and lines:
                candidates.append(lines[-1])
        except (OSError, subprocess.SubprocessError):
            pass
    candidates.append(str(REPO / ".venv-mxnet" / "bin" / "python"))
    why = "no MXNet venv (tests/envs/mxnet.sh missing or failed, no .venv-mxnet)"
    for py in candidates:
        if not (os.path.exists(py) or shutil.which(py)):
            continue
        probe = (
            "import mxnet; from mxnet.runtime import Features; "
            "print(mxnet.__version__, Features().is_enabled('DIST_KVSTORE'))"
        )
        try:
            res = subprocess.run(
                [py, "-c", probe],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env={**os.environ, "PYTHONNOUSERSITE": "1"},
            )
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"{py}: {exc}"
            continue
        if res.returncode != 0:
            why = f"{py} cannot import mxnet: {res.stderr.strip().splitlines()[-1:]}"
            continue
        if res.stdout.split()[-1:] != ["True"]:
            why = f"{py}: MXNet {res.stdout.strip()} is built without DIST_KVSTORE"
            continue
        return py, f"MXNet {res.stdout.split()[0]}"
    return None, why


def wait_all(rack: Any, launch: Launch, timeout_s: float) -> Tuple[bool, str]:
    """Runs a launch to completion; (ok, error text)."""
    from benchmarks.rack import RackProcessError

    try:
        rack.run_all(launch.procs, timeout=timeout_s, check=True, fail_grace=3.0)
        return True, ""
    except RackProcessError as exc:
        return False, str(exc)[-4000:]
