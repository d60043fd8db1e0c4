"""CPU time of processes and their threads, read from /proc (Linux).

On a loaded machine wall time measures the load; the CPU a process spends per iteration
does not (roughly: caches and frequency still vary). ``thread_cpu`` reads every thread's
run time in nanoseconds (``/proc/PID/task/TID/schedstat``; ``stat``'s clock ticks where
schedstat is missing) and sums it per thread name (``comm``: the C++ core names its
threads, ``fastps-push``, ``fastps-io``, ``fastps-sum0``, ...). ``CpuSampler`` samples a set
of processes from outside (the servers of a run) so that the CPU they spent inside a
window of wall-clock time (the timed iterations the workers report) can be read off.
"""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

_TICK = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:  # the thread or process ended between listing and reading
        return None


def _task_seconds(task: str) -> Optional[float]:
    sched = _read(f"{task}/schedstat")
    if sched:
        return int(sched.split()[0]) * 1e-9
    stat = _read(f"{task}/stat")
    if not stat:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * _TICK  # utime + stime


def thread_cpu(pid: int | str = "self") -> Dict[str, float]:
    """CPU seconds each thread name of process ``pid`` has used so far (threads of one
    name summed; threads that already ended are not counted)."""
    out: Dict[str, float] = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        task = f"{base}/{tid}"
        comm = (_read(f"{task}/comm") or "?").strip()
        secs = _task_seconds(task)
        if secs is not None:
            out[comm] = out.get(comm, 0.0) + secs
    return out


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> Dict[str, float]:
    """Per thread name: CPU seconds between two ``thread_cpu`` readings (threads born in
    between count from zero)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


class _Sampling(ABC):
    """Calls ``sample()`` every ``interval`` seconds on a thread of its own while the
    ``with`` block runs, keeping (wall-clock time, value) pairs in ``samples``."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self.samples: List[Tuple[float, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abstractmethod
    def sample(self) -> Any:
        """One reading (what each sampler reads)."""

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self.sample()))
            self._stop.wait(self.interval)


class CpuSampler(_Sampling):
    """Samples ``thread_cpu`` of labelled processes every ``interval`` seconds on a
    thread of its own, with the wall-clock time (``time.time()``) of each sample."""

    def __init__(self, pids: Mapping[str, int], interval: float = 0.2) -> None:
        super().__init__(interval, "cpu-sampler")
        self.pids = dict(pids)

    def sample(self) -> Dict[str, Dict[str, float]]:
        return {k: thread_cpu(p) for k, p in self.pids.items()}

    def window(self, t0: float, t1: float) -> Tuple[float, Dict[str, Dict[str, float]]]:
        """(seconds, per label the per-thread CPU seconds) between the first sample at or
        after ``t0`` and the last at or before ``t1``; (0, {}) if fewer than two fit."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return 0.0, {}
        (a_t, a), (b_t, b) = inside[0], inside[-1]
        return b_t - a_t, {k: delta(b.get(k, {}), a.get(k, {})) for k in b}


def _stat_seconds(first_line: bytes) -> Tuple[float, float]:
    """(busy, interrupt + softirq) CPU seconds from /proc/stat's ``cpu`` line. Busy is
    user + system + irq + softirq + steal: the ``nice`` column is left out so that work
    started with ``nice`` (a build beside the benchmark) does not count against the job."""
    vals = [int(v) for v in first_line.split()[1:9]] + [0] * 8
    user, _nice, system, _idle, _iowait, irq, softirq, steal = vals[:8]
    return (user + system + irq + softirq + steal) * _TICK, (irq + softirq) * _TICK


def _proc_stat_line() -> bytes:
    return (_read("/proc/stat") or "cpu 0").splitlines()[0].encode()


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine have been busy since boot, from /proc/stat
    (``_stat_seconds``)."""
    return _stat_seconds(_proc_stat_line())[0]


class BusyReader(Protocol):
    """What reads off CPU seconds inside wall-clock spans (a counter sampler, or one counter
    of a sampler that reads several)."""

    def busy_in(self, spans: List[Tuple[float, float]]) -> Optional[float]: ...


class _CounterSampling(_Sampling):
    """Samples one growing counter of CPU seconds; reads off what it grew by inside given
    wall-clock spans (the timed iterations of a job)."""

    def _at(self, t: float) -> Optional[float]:
        """The counter at wall time ``t``, interpolated between the samples around it."""
        return _interpolate(self.samples, t)

    def busy_in(self, spans: List[Tuple[float, float]]) -> Optional[float]:
        """CPU seconds inside the wall-clock spans; None if a span lies outside the
        samples."""
        return _busy_in(self.samples, spans)


def _interpolate(samples: List[Tuple[float, Any]], t: float) -> Optional[float]:
    """A counter sampled as (wall time, value) pairs, at wall time ``t``: linear between the
    samples around it; None outside them."""
    for (t0, b0), (t1, b1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return float(b0 if t1 == t0 else b0 + (b1 - b0) * (t - t0) / (t1 - t0))
    return None


def _busy_in(samples: List[Tuple[float, Any]], spans: List[Tuple[float, float]]) -> Optional[float]:
    total = 0.0
    for a, b in spans:
        ba, bb = _interpolate(samples, a), _interpolate(samples, b)
        if ba is None or bb is None:
            return None
        total += bb - ba
    return total


class MachineCpuSampler(_CounterSampling):
    """Samples ``machine_busy_seconds`` every ``interval`` seconds (wall-clock time of each
    sample) so that the CPU the whole machine spent inside given wall-clock spans, the
    timed iterations of a job, can be read off afterwards: every process of every emulated
    host, and the kernel's packet work (softirq) that belongs to no process."""

    def __init__(self, interval: float = 0.01) -> None:
        super().__init__(interval, "machine-cpu")

    def sample(self) -> float:
        return machine_busy_seconds()


def machine_irq_seconds() -> float:
    """CPU seconds of interrupt and softirq work since boot (/proc/stat): the kernel's
    packet work, which no process is charged for."""
    return _stat_seconds(_proc_stat_line())[1]


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class JobCpuSampler(_CounterSampling):
    """The CPU of one job's processes alone, however loaded the machine is: the processes
    join a cgroup of their own (v1 ``cpuacct``; children stay in it), whose ``cpuacct.usage``
    counts every thread's run time, plus the machine's interrupt and softirq time (the
    packet work of every emulated host, which the kernel charges to no process; the only
    part another job's work can leak into). ``available()`` says whether this kernel
    offers it (root, cgroup v1 cpuacct mounted)."""

    def __init__(self, name: str, interval: float = 0.01) -> None:
        super().__init__(interval, "job-cpu")
        self.group = CPUACCT / name

    @staticmethod
    def available() -> bool:
        return os.access(CPUACCT / "cgroup.procs", os.W_OK)

    def __enter__(self) -> Any:
        self.group.mkdir(exist_ok=True)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._remove_group()

    def _remove_group(self) -> None:
        # A cgroup is removed only when empty: move what is still alive to the root.
        for line in (_read(str(self.group / "cgroup.procs")) or "").split():
            try:
                (CPUACCT / "cgroup.procs").write_text(line)
            except OSError:
                pass
        try:
            self.group.rmdir()
        except OSError:
            pass

    def add(self, pid: int) -> None:
        """Charges process ``pid`` (and the children it starts from now on) to the job."""
        (self.group / "cgroup.procs").write_text(str(pid))

    def sample(self) -> float:
        usage = _read(str(self.group / "cpuacct.usage"))
        return (int(usage) * 1e-9 if usage else 0.0) + machine_irq_seconds()


class _KeptFile:
    """A counter file read again and again from offset 0 on one descriptor (``pread``):
    sampling every 10 ms, an ``open`` per reading cost about three times the read itself."""

    def __init__(self, path: Path | str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, size: int = 4096) -> bytes:
        return os.pread(self.fd, size, 0)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class JobAndMachineSampler(JobCpuSampler):
    """``JobCpuSampler`` and ``MachineCpuSampler`` in one: both counters read in the same
    sample, on one thread, from files kept open. Sampling both every 10 ms on two threads
    that opened each file anew cost about 8% of a core on the 2-core VM (2026-12-02), taken
    from the job it measured; this costs about a third of that. ``busy_in`` is the job's
    CPU, ``machine.busy_in`` the whole machine's."""

    def __init__(self, name: str, interval: float = 0.01) -> None:
        super().__init__(name, interval)
        self._stat: Optional[_KeptFile] = None
        self._usage: Optional[_KeptFile] = None
        self.machine = _SeriesView(self, 1)

    def __enter__(self) -> Any:
        self.group.mkdir(exist_ok=True)
        try:
            self._stat = _KeptFile("/proc/stat")
            self._usage = _KeptFile(self.group / "cpuacct.usage")
        except OSError:
            if self._stat is not None:
                self._stat.close()
            self._remove_group()  # not left behind for the next run to trip over
            raise
        return _Sampling.__enter__(self)

    def __exit__(self, *exc: object) -> None:
        _Sampling.__exit__(self, *exc)  # the thread stops before its files close
        for f in (self._stat, self._usage):
            if f is not None:
                f.close()
        self._remove_group()

    def sample(self) -> Tuple[float, float]:  # type: ignore[override]
        assert self._stat is not None and self._usage is not None
        busy, irq = _stat_seconds(self._stat.read().split(b"\n", 1)[0])
        usage = self._usage.read(64).strip()
        return (int(usage) * 1e-9 if usage else 0.0) + irq, busy

    def busy_in(self, spans: List[Tuple[float, float]]) -> Optional[float]:
        return _busy_in([(t, v[0]) for t, v in self.samples], spans)


class _SeriesView:
    """One counter of a sampler whose samples hold several, read off like a sampler's."""

    def __init__(self, sampler: _Sampling, index: int) -> None:
        self.sampler = sampler
        self.index = index

    def busy_in(self, spans: List[Tuple[float, float]]) -> Optional[float]:
        return _busy_in([(t, v[self.index]) for t, v in self.sampler.samples], spans)
