"""Emulated machines on a rack: each host gets its own host name, ``/etc/hosts``, root's
``~/.ssh`` and a real OpenSSH server, so ``fastpsrun -H w0:1,w1:1,...`` can be run across
them exactly as across real machines.

Per host ``h`` of a :class:`~benchmarks.rack.Rack`, ``sshd -D`` runs inside the host's
network namespace and in a new UTS + mount namespace where

* the host name is ``h`` (``socket.gethostname()`` differs per machine, as fastps expects);
* ``/etc/hosts`` names every host of the rack (``w0``, ``c1``, ...) and nothing else;
* ``/root/.ssh`` (``~/.ssh`` of root) is this run's folder: a client key made for the run,
  ``authorized_keys`` with it, ``known_hosts`` with the run's host key under every name and
  address — plain ``ssh w1`` works with host keys checked;
* sshd answers on ports 22 and 2222 (to try ``--ssh-port``);
* optionally, some paths are hidden under an empty tmpfs (a machine "without fastps").

Every process started on ``h`` (by the test through :meth:`Machines.spawn` or by sshd for a
login) shares those namespaces. Keys and configuration live in a temporary folder made per
run. sshd and its sessions are processes of the host's network namespace, so the rack's own
teardown stops them. Needs root and OpenSSH (``sh benchmarks/rack/setup_deps.sh --ssh``
installs Debian's ``openssh-server`` and ``openssh-client`` when missing).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from .rack import Host, HostRef, Rack, RackError, _ns_pids

__all__ = ["Machines", "ssh_supported", "ensure_ssh", "SSHD"]

SSHD = "/usr/sbin/sshd"
_SETUP = Path(__file__).with_name("setup_deps.sh")

_SSHD_CONFIG = """\
Port 22
Port 2222
HostKey {host_key}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 100:30:200
MaxSessions 100
LogLevel ERROR
"""

# Runs as `sh -c SCRIPT sh NAME HOSTS SSHDIR HIDE... -- SSHD ARGS...` in the new namespaces.
_ENTER = r"""
set -e
hostname "$1"
mount --bind "$2" /etc/hosts
mount --bind "$3" "$4"
shift 4
while [ "$1" != "--" ]; do mount -t tmpfs -o size=1m,mode=0755 none "$1"; shift; done
shift
exec "$@"
"""


def ssh_supported() -> tuple:
    """(True, "") when sshd, ssh, ssh-keygen, unshare and nsenter are all here."""
    for tool in (SSHD, "ssh", "ssh-keygen", "unshare", "nsenter"):
        if not (os.path.exists(tool) if tool.startswith("/") else shutil.which(tool)):
            return False, f"{tool} is missing (sh benchmarks/rack/setup_deps.sh --ssh)"
    return True, ""


def ensure_ssh() -> tuple:
    """Installs OpenSSH with the project's setup script when missing (root, apt)."""
    ok, why = ssh_supported()
    if ok:
        return ok, why
    res = subprocess.run(["sh", str(_SETUP), "--ssh"], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        return False, f"installing OpenSSH failed: {res.stderr.strip()[-500:]}"
    return ssh_supported()


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path.with_suffix(".pub").read_text().strip()


class Machines:
    """sshd on every host of a running rack; use as a context manager inside the rack's."""

    def __init__(
        self,
        rack: Rack,
        hide: Optional[Mapping[str, Sequence[str]]] = None,
        extra_hosts: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.rack = rack
        self.hide = {rack.host(h).name: list(paths) for h, paths in (hide or {}).items()}
        self.extra_hosts = dict(extra_hosts or {})  # name -> address, e.g. a host that is off
        self.dir: Optional[Path] = None
        self.sshd: Dict[str, subprocess.Popen] = {}
        self.home_ssh = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"

    def __enter__(self) -> Machines:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ssh_dir(self) -> Path:
        assert self.dir is not None
        return self.dir / "ssh"

    def start(self) -> Machines:
        ok, why = ssh_supported()
        if not ok:
            raise RackError(why)
        self.dir = Path(tempfile.mkdtemp(prefix=f"rack-{self.rack.prefix}-ssh-"))
        ssh_dir = self.ssh_dir
        ssh_dir.mkdir(mode=0o700)
        host_pub = _keygen(self.dir / "host_key", "rack host key")
        client_pub = _keygen(ssh_dir / "id_ed25519", "rack client key")
        (ssh_dir / "authorized_keys").write_text(client_pub + "\n")
        lines = ["127.0.0.1 localhost"]
        known = []
        for h in self.rack.hosts:
            lines.append(f"{h.addr} {h.name}")
            known.append(f"{h.name},{h.addr} {host_pub}")
        for name, addr in self.extra_hosts.items():
            lines.append(f"{addr} {name}")
        (self.dir / "hosts").write_text("\n".join(lines) + "\n")
        (ssh_dir / "known_hosts").write_text("\n".join(known) + "\n")
        (ssh_dir / "config").write_text(
            "Host *\n  User root\n  BatchMode yes\n  StrictHostKeyChecking yes\n"
        )
        for p in ssh_dir.iterdir():
            p.chmod(0o600)
        cfg = self.dir / "sshd_config"
        cfg.write_text(_SSHD_CONFIG.format(host_key=self.dir / "host_key"))
        # sshd's privilege-separation directory (the Debian service makes it at start).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        # The mount point for the per-run ~/.ssh must exist; an empty one is left if made.
        self.home_ssh.mkdir(mode=0o700, exist_ok=True)
        try:
            for h in self.rack.hosts:
                self._start_sshd(h, cfg)
            self._wait_listening(timeout=15.0)
        except BaseException:
            self.close()
            raise
        return self

    def _enter_argv(self, h: Host, argv: Sequence[str]) -> List[str]:
        assert self.dir is not None
        return [
            "unshare",
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _ENTER,
            "sh",
            h.name,
            str(self.dir / "hosts"),
            str(self.ssh_dir),
            str(self.home_ssh),
            *self.hide.get(h.name, []),
            "--",
            *argv,
        ]

    def _start_sshd(self, h: Host, cfg: Path) -> None:
        argv = self._enter_argv(
            h, [SSHD, "-D", "-e", "-f", str(cfg), "-o", f"ListenAddress={h.addr}"]
        )
        # sshd builds every session's environment itself; what spawn adds stays with sshd.
        self.sshd[h.name] = self.rack.spawn(h, argv, label="sshd")

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = {h.name for h in self.rack.hosts}
        while pending:
            for name in sorted(pending):
                proc = self.sshd[name]
                if proc.poll() is not None:
                    raise RackError(
                        f"sshd on {name} exited with {proc.returncode}:\n"
                        f"{self.rack.logs()[name][-2000:]}"
                    )
                h = self.rack.host(name)
                res = subprocess.run(
                    ["ip", "netns", "exec", h.ns, "ss", "-Hltn", f"src {h.addr}:22"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                if "LISTEN" in res.stdout:
                    pending.discard(name)
            if pending and time.monotonic() > deadline:
                raise RackError(f"sshd not listening after {timeout:g} s on {sorted(pending)}")
            if pending:
                time.sleep(0.05)

    def sshd_pid(self, host: HostRef) -> int:
        return self.sshd[self.rack.host(host).name].pid

    def machine_argv(
        self, host: HostRef, argv: Sequence[str], cwd: Optional[str] = None
    ) -> List[str]:
        """argv run on the machine: in its host name and file view (its network namespace
        comes from ``Rack.spawn``), in ``cwd`` (default: ours)."""
        return [
            "nsenter",
            "-t",
            str(self.sshd_pid(host)),
            "-u",
            "-m",
            f"--wd={cwd or os.getcwd()}",
            "--",
            *argv,
        ]

    def spawn(
        self,
        host: HostRef,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        label: Optional[str] = None,
    ) -> subprocess.Popen:
        """Starts argv on the machine, logged like ``Rack.spawn`` (which adds FASTPS_HOST and
        FASTPS_HOSTNAME to the environment: drop them with ``env`` values of "" if the
        processes must find their own)."""
        return self.rack.spawn(
            host, self.machine_argv(host, argv, cwd), env=env, cwd=cwd, label=label
        )

    def processes(self, host: HostRef) -> List[int]:
        """Live processes in the host's network namespace other than its sshd listener."""
        h = self.rack.host(host)
        keep = {self.sshd_pid(h)}
        out = []
        for pid in _ns_pids(h.ns):
            if pid in keep:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"Z", b"X"):
                out.append(pid)
        return out

    def describe(self, pids: Sequence[int]) -> List[str]:
        out = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            except OSError:
                cmd = "?"
            out.append(f"{pid}: {cmd}")
        return out

    def close(self) -> None:
        for proc in self.sshd.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sshd.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
