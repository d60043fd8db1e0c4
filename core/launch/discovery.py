"""Horovod's host discovery script: prints the hosts available now, ``host:slots`` a line
(``host`` alone means one slot). fastpsrun runs it periodically in elastic mode."""

from __future__ import annotations

import subprocess
from typing import Dict, List, Tuple

from fastps.errors import FastPSError

DISCOVERY_TIMEOUT = 10.0  # one run of the script


def parse(text: str, script: str) -> Dict[str, int]:
    """``{host: slots}`` in the order printed; a malformed line is an error naming it."""
    hosts: Dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        host, sep, slots_text = line.partition(":")
        host = host.strip()
        try:
            slots = int(slots_text) if sep else 1
        except ValueError:
            slots = -1
        if not host or slots < 0:
            raise FastPSError(
                f"host discovery script {script!r}, line {number}: {raw!r} is not 'host:slots'"
            )
        hosts[host] = hosts.get(host, 0) + slots
    return hosts


def discover(script: str, timeout: float = DISCOVERY_TIMEOUT) -> Dict[str, int]:
    """Runs the script once (bounded); its failure is an error naming the script."""
    try:
        done = subprocess.run(
            script,
            shell=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise FastPSError(
            f"host discovery script {script!r} ran longer than {timeout:g} s"
        ) from None
    except OSError as exc:
        raise FastPSError(f"host discovery script {script!r} could not run: {exc}") from None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        tail = f": {err[-1]}" if err else ""
        raise FastPSError(
            f"host discovery script {script!r} exited with code {done.returncode}{tail}"
        )
    return parse(done.stdout.decode("utf-8", "replace"), script)


def slots(hosts: Dict[str, int]) -> List[Tuple[str, int]]:
    """Every (host, slot index) the discovery offers, host by host."""
    return [(host, i) for host, n in hosts.items() for i in range(n)]
