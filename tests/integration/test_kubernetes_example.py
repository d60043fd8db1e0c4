"""examples/kubernetes: the manifests agree with each other, and the processes they describe,
started here with the variables they set, train to completion.

Each pod becomes a local process with its own loopback address as its pod IP (so two servers
may use the same port, as in separate pods) and its pod name as host name; the scheduler
Service's name resolves to the scheduler pod's address, as cluster DNS would; the Secret's
value is the token; ``python`` is this interpreter and the image's /opt/fastps this checkout.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "examples" / "kubernetes"
IMAGE_DIR = "/opt/fastps"


def _docs() -> Dict[Tuple[str, str], Dict[str, Any]]:
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _container(workload: Dict[str, Any]) -> Dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(
    workload: Dict[str, Any], secrets: Dict[str, Dict[str, str]], pod_ip: str, index: int
) -> Dict[str, str]:
    """The container's variables as the kubelet would set them in pod number ``index``."""
    env = {}
    for item in _container(workload).get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        src = item["valueFrom"]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
        elif src["fieldRef"]["fieldPath"] == "status.podIP":
            env[item["name"]] = pod_ip
        elif src["fieldRef"]["fieldPath"] in (
            "metadata.labels['apps.kubernetes.io/pod-index']",
            "metadata.annotations['batch.kubernetes.io/job-completion-index']",
        ):
            env[item["name"]] = str(index)
        else:
            raise AssertionError(f"unexpected fieldRef {src['fieldRef']}")
    return env


def _labels(workload: Dict[str, Any]) -> Dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def test_manifests_agree() -> None:
    docs = _docs()
    svc = docs[("Service", "fastps-scheduler")]
    sched = docs[("Job", "fastps-scheduler")]
    servers = docs[("StatefulSet", "fastps-server")]
    workers = docs[("Job", "fastps-worker")]
    secret = docs[("Secret", "fastps-digits")]
    secrets = {"fastps-digits": secret["stringData"]}
    n, k = workers["spec"]["completions"], servers["spec"]["replicas"]
    assert workers["spec"]["completionMode"] == "Indexed"
    assert workers["spec"]["parallelism"] == n
    # The Service selects the scheduler pod and forwards to the port it binds.
    assert all(_labels(sched).get(key) == v for key, v in svc["spec"]["selector"].items())
    bind = _env(sched, secrets, "0.0.0.0", 0)["FASTPS_SCHEDULER_ADDR"]
    assert bind == f"0.0.0.0:{svc['spec']['ports'][0]['targetPort']}"
    for workload in (sched, servers, workers):
        env = _env(workload, secrets, "10.0.0.1", 0)
        assert env["FASTPS_NUM_WORKERS"] == str(n) and env["FASTPS_NUM_SERVERS"] == str(k)
        assert env["FASTPS_JOB_ID"] == "digits" and env["FASTPS_TOKEN"]
        if workload is not sched:
            assert (
                env["FASTPS_SCHEDULER_ADDR"]
                == f"{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
            )
    assert _env(servers, secrets, "x", 1)["FASTPS_SERVER_ID"] == "1"
    assert _env(workers, secrets, "x", 1)["FASTPS_RANK"] == "1"
    assert servers["spec"]["selector"]["matchLabels"].items() <= _labels(servers).items()


def _argv(workload: Dict[str, Any]) -> Tuple[List[str], str]:
    c = _container(workload)
    argv = [sys.executable if a == "python" else a for a in c["command"] + c.get("args", [])]
    cwd = c.get("workingDir", IMAGE_DIR).replace(IMAGE_DIR, str(REPO))
    return argv, cwd


@pytest.mark.timeout(300)
def test_manifest_processes_train(subprocess_env: Dict[str, str]) -> None:
    docs = _docs()
    secrets = {"fastps-digits": docs[("Secret", "fastps-digits")]["stringData"]}
    svc = docs[("Service", "fastps-scheduler")]
    pods: List[Tuple[str, Dict[str, Any], int]] = [
        ("fastps-scheduler-x", docs[("Job", "fastps-scheduler")], 0)
    ]
    servers = docs[("StatefulSet", "fastps-server")]
    workers = docs[("Job", "fastps-worker")]
    pods += [(f"fastps-server-{i}", servers, i) for i in range(servers["spec"]["replicas"])]
    pods += [(f"fastps-worker-{i}", workers, i) for i in range(workers["spec"]["completions"])]
    procs = []
    try:
        for n, (name, workload, index) in enumerate(pods):
            pod_ip = f"127.0.20.{n + 1}"
            env = dict(subprocess_env)
            env.update(_env(workload, secrets, pod_ip, index))
            env["FASTPS_HOSTNAME"] = name  # a pod's host name is its name
            env["OMP_WAIT_POLICY"] = "PASSIVE"
            addr = env["FASTPS_SCHEDULER_ADDR"]
            # Cluster DNS: the Service name is the scheduler pod's address.
            env["FASTPS_SCHEDULER_ADDR"] = addr.replace(svc["metadata"]["name"], "127.0.20.1")
            if name.startswith("fastps-scheduler"):
                env["FASTPS_SCHEDULER_ADDR"] = addr.replace("0.0.0.0", pod_ip)
            argv, cwd = _argv(workload)
            procs.append(
                (
                    name,
                    subprocess.Popen(
                        argv,
                        env=env,
                        cwd=cwd,
                        text=True,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                    ),
                )
            )
        deadline = time.monotonic() + 240
        while any(p.poll() is None for _, p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        outputs = {
            name: p.communicate(timeout=10)[0] if p.poll() is not None else "(running)"
            for name, p in procs
        }
        codes = {name: p.poll() for name, p in procs}
        assert all(c == 0 for c in codes.values()), (codes, outputs)
        found = re.search(r"test accuracy: ([0-9.]+)", outputs["fastps-worker-0"])
        assert found and float(found.group(1)) >= 0.9, outputs["fastps-worker-0"]
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
