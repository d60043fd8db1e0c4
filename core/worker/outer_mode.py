"""Local SGD and DiLoCo on the core's data plane (docs/guide/local-sgd.md), for every plugin.

The servers keep each parameter and the state of an *outer optimizer*
(``csrc/server/outer_optimizer.h``): every H local steps each worker pushes the change of
its parameters since the last outer step (its delta); once every worker's delta of the
round is in, the server averages them, applies the outer step (plain averaging for local
SGD; SGD with Nesterov momentum for DiLoCo) and answers every worker with the new
parameters. One exchange both pushes and pulls.

The exchanges are the async mode's pushes (``async_mode.py``) with a 64-byte header in front
of every part (``OuterHeader`` in ``csrc/protocol/messages.h``): rank 0's init names the outer
optimizer, each delta its outer round, each answer the rounds done. The worker core cuts a
tensor into parts without knowing the mode, so this module lays each parameter out in a
*framed* buffer whose parts (the core's own ``part_layout``) each begin with a header.

Arrays are host memory (numpy float16/32/64); each parameter is named, the same on every
worker. With one worker there is no server: the same rule runs locally.

Quorum rounds (FASTPS_ROUND_QUORUM=k, set on the servers) close an outer round once k deltas
are in; a late delta is dropped and answered with that round's parameters, so nothing
changes here. ``compression`` (a core compressor, ``fastps.Compression.fp16`` ...) sends the
deltas compressed: each part's delta is encoded here (the worker's error feedback by part),
and its header names how many bytes of the part the core sends (``wire_len``); the answer
is the parameters, uncompressed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from fastps.errors import FastPSError
from fastps.worker import api
from fastps.worker import compression as _compression
from fastps.worker.async_mode import MODE_INIT, MODE_READ, MODE_UPDATE
from fastps.worker.buffers import raw_buffer

__all__ = [
    "OuterConfig",
    "OuterExchange",
    "OuterRounds",
    "LocalSGDRounds",
    "check_outer_config",
    "PREFIX",
]

# Tensor names of outer-optimizer parameters: apart from the async mode's, so a name can
# never hold parts of both kinds on a server.
PREFIX = "outer."
_DTYPES = (np.float16, np.float32, np.float64)


def _core() -> Any:
    from fastps import _core

    return _core


def check_outer_config(lr: Any, momentum: Any, nesterov: Any, who: str) -> None:
    """Raises ValueError/TypeError naming the first setting the servers would refuse."""
    for what, v in (("outer_lr", lr), ("momentum", momentum)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{who}: {what} must be a number, got {v!r}")
    if not isinstance(nesterov, bool):
        raise TypeError(f"{who}: nesterov must be True or False, got {nesterov!r}")
    # The servers' own check (outer_config_error), so both ends refuse with the same words.
    bad = _core().outer_config_error(float(lr), float(momentum), nesterov)
    if bad:
        raise ValueError(f"{who}: {bad}")


@dataclass(frozen=True)
class OuterConfig:
    """The outer optimizer the servers run: ``lr`` 1 and ``momentum`` 0 is plain averaging
    (local SGD); DiLoCo is ``lr`` 0.7, ``momentum`` 0.9, ``nesterov`` True."""

    lr: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        check_outer_config(self.lr, self.momentum, self.nesterov, "OuterConfig")


class _Framed:
    """One parameter laid out in outer frames: every part of the tensor ``PREFIX + name``
    (as the worker core cuts it) is a header followed by the next slice of the
    parameter's bytes; the last part's tail past the parameter is zero padding."""

    def __init__(self, name: str, like: np.ndarray, worker: Any) -> None:
        if like.dtype.type not in _DTYPES:
            raise FastPSError(
                f"outer parameter '{name}': dtype {like.dtype} is not supported "
                "(float16, float32, float64)"
            )
        core = _core()
        self.name = name
        self.core_name = PREFIX + name
        self.dtype = like.dtype
        self.shape = like.shape
        hdr = int(core.OUTER_HEADER_BYTES)
        elem = like.dtype.itemsize
        nbytes = like.nbytes
        # The core cuts by the tensor's size, and the headers add to it: grow the framed
        # size until every part has room for its header and one element at least, and the
        # parts' room after their headers holds the whole parameter.
        framed = nbytes + hdr
        for _ in range(256):
            spans = [
                (int(o), int(n)) for o, n, _s in worker.part_layout(self.core_name, framed, elem)
            ]
            room = framed - hdr * len(spans)
            shortest = min(n for _o, n in spans)
            if room < nbytes:
                framed += nbytes - room
            elif shortest < hdr + elem:
                # Slices by server weight grow in proportion to the whole: grow it enough.
                framed += (hdr + elem - shortest) * max(1, framed // max(shortest, elem))
            else:
                break
        else:  # pragma: no cover - the layout grows by whole parts; never seen
            raise FastPSError(f"outer parameter '{name}': no part layout fits its headers")
        self.spans = spans
        self.tensor_id = int(core.tensor_id(self.core_name))
        self.buf = np.zeros(framed // elem, dtype=like.dtype)
        self.bytes = self.buf.view(np.uint8)
        # (part index, framed offset of its data, parameter byte range) per part.
        self.slices: List[Tuple[int, int, int, int]] = []
        at = 0
        for i, (off, n) in enumerate(spans):
            take = max(0, min(n - hdr, nbytes - at))
            self.slices.append((i, off + hdr, at, at + take))
            at += take

    def pack(self, values: np.ndarray, kind: int, rnd: int, cfg: OuterConfig) -> None:
        core = _core()
        src = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1).view(np.uint8)
        hdr = int(core.OUTER_HEADER_BYTES)
        for i, data_at, lo, hi in self.slices:
            head = core.outer_header(
                kind, rnd, float(cfg.lr), float(cfg.momentum), cfg.nesterov, self.tensor_id, i
            )
            self.bytes[data_at - hdr : data_at] = np.frombuffer(head, dtype=np.uint8)
            self.bytes[data_at : data_at + hi - lo] = src[lo:hi]

    def pack_compressed(
        self, values: np.ndarray, rnd: int, cfg: OuterConfig, spec: str, ef: Any, rank: int
    ) -> None:
        """Packs a delta with each part's values encoded by ``spec`` (a core compressor's
        canonical text), error feedback through ``ef`` keyed by part. A part whose encoding
        would not be shorter than its uncompressed values travels uncompressed."""
        core = _core()
        src = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1)
        base = src.ctypes.data
        hdr = int(core.OUTER_HEADER_BYTES)
        elem = self.dtype.itemsize
        dtype = str(self.dtype)
        lr, mom, nesterov = float(cfg.lr), float(cfg.momentum), cfg.nesterov
        for i, data_at, lo, hi in self.slices:
            n = (hi - lo) // elem
            span = self.spans[i][1]
            enc = int(core.compressed_bytes(spec, n)) if n else 0
            wire = -(-(hdr + enc) // elem) * elem
            if n == 0 or wire >= span:
                head = core.outer_header(
                    core.OUTER_DELTA, rnd, lr, mom, nesterov, self.tensor_id, i
                )
                self.bytes[data_at - hdr : data_at] = np.frombuffer(head, dtype=np.uint8)
                self.bytes[data_at : data_at + hi - lo] = src.view(np.uint8)[lo:hi]
                continue
            key = (self.tensor_id ^ (i * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF
            seed = (key * 0x100000001B3 + rnd * 0x9E3779B1 + rank) & 0xFFFFFFFFFFFFFFFF
            got = core.encode_part_into(
                spec, base + lo, dtype, n, seed, ef, key, self.buf.ctypes.data + data_at, span - hdr
            )
            if int(got) != enc:  # pragma: no cover - compressed_bytes is the encoder's size
                raise FastPSError(
                    f"outer parameter '{self.name}': {spec} wrote {got} bytes, not {enc}"
                )
            self.bytes[data_at + enc : data_at - hdr + wire] = 0  # the padding to an element
            head = core.outer_header(
                core.OUTER_DELTA, rnd, lr, mom, nesterov, self.tensor_id, i, wire_len=wire
            )
            self.bytes[data_at - hdr : data_at] = np.frombuffer(head, dtype=np.uint8)

    def wire_bytes(self, spec: str) -> int:
        """The bytes a delta of this parameter pushes (headers included, frames excluded):
        compressed with ``spec``, or uncompressed for ``""``."""
        core = _core()
        hdr = int(core.OUTER_HEADER_BYTES)
        elem = self.dtype.itemsize
        total = 0
        for i, _data_at, lo, hi in self.slices:
            n = (hi - lo) // elem
            span = self.spans[i][1]
            if not spec or n == 0:
                total += span
                continue
            wire = -(-(hdr + int(core.compressed_bytes(spec, n))) // elem) * elem
            total += min(wire, span)
        return total

    def unpack(self, out: np.ndarray, want_round: Optional[int], what: str) -> int:
        """Copies the answered parameters into ``out``; returns the outer round the answer
        holds (every part must say the same, and ``want_round`` if given)."""
        core = _core()
        hdr = int(core.OUTER_HEADER_BYTES)
        dst = out.reshape(-1).view(np.uint8)
        rounds = set()
        for i, data_at, lo, hi in self.slices:
            head = core.parse_outer_header(self.bytes[data_at - hdr : data_at].tobytes())
            if head is None or head["kind"] != core.OUTER_PARAMS or head["part"] != i:
                raise FastPSError(
                    f"{what}: parameter '{self.name}': part {i} of the servers' answer holds no "
                    "outer parameters header (a server without the outer optimizer?)"
                )
            rounds.add(int(head["round"]))
            dst[lo:hi] = self.bytes[data_at : data_at + hi - lo]
        if len(rounds) != 1 or (want_round is not None and rounds != {want_round}):
            raise FastPSError(
                f"{what}: parameter '{self.name}': the servers answered outer rounds "
                f"{sorted(rounds)}, expected {want_round if want_round is not None else 'one'}"
            )
        return rounds.pop()


class OuterExchange:
    """The outer steps of one set of parameters against the servers' outer optimizer.

    :meth:`init` (every worker; rank 0's values win) starts the servers, :meth:`step`
    pushes each worker's delta of the round and writes the new parameters, :meth:`read`
    fetches them. Every wait has the core's op timeout (FASTPS_OP_TIMEOUT).

    ``compression``: a core compressor (``fastps.Compression.fp16``, ``.onebit(
    error_feedback=True)``, ...) the deltas are pushed with; None: uncompressed (the
    FASTPS_COMPRESSION default does not apply here)."""

    def __init__(self, what: str, config: OuterConfig, compression: Any = None) -> None:
        self.what = what
        self.config = config
        self.compression = compression
        # The worker's error feedback for compressed deltas, by part; a new layout (init)
        # starts it afresh.
        self._ef: Any = None
        self.round = 0  # outer steps done
        # The core session whose servers hold the parameters (None: none yet): an elastic
        # membership change brings new servers, which must be initialized again.
        self.session: Any = None
        self._frames: Dict[str, _Framed] = {}
        self._specs: Dict[str, str] = {}  # by parameter: its deltas' compressor ("": none)
        # One worker, no servers: the rule runs here, on float64 copies.
        self._local: Dict[str, Tuple[Any, np.ndarray]] = {}
        # The round start() began and finish() has not waited for: ([(frame, out)],
        # [(name, handle)]).
        self._pending: Optional[Tuple[List[Tuple[_Framed, np.ndarray]], List[Any]]] = None

    @staticmethod
    def _alone() -> bool:
        return api.size() == 1

    def _wait(self, handles: Sequence[Tuple[str, api.Handle]]) -> None:
        for name, h in handles:
            try:
                h.synchronize()
            except FastPSError as exc:
                raise type(exc)(f"{self.what}: parameter '{name}': {exc}") from None

    def _start(self, f: _Framed, mode: int, send: bool) -> api.Handle:
        src = raw_buffer(f.buf, f"outer parameter '{f.name}'")
        dst = raw_buffer(f.buf, f"outer parameter '{f.name}'", writable=True)
        return api.push_pull_raw(src, dst, f.core_name, send=send, receive=True, mode=mode)

    def init(self, named: Sequence[Tuple[str, np.ndarray]]) -> None:
        """Every worker's arrays become rank 0's, which the servers keep with a fresh outer
        optimizer state (no momentum yet)."""
        if self._pending is not None:
            raise FastPSError(
                f"{self.what}: outer round {self.round} is still in flight (finish or "
                "abandon it before init)"
            )
        self._local = {}
        if self._alone():
            core = _core()
            for name, arr in named:
                opt = core.OuterOptimizer(
                    self.config.lr, self.config.momentum, self.config.nesterov
                )
                self._local[name] = (opt, np.array(arr, dtype=np.float64).reshape(-1))
            self.session = None
            return
        # New frames: a new session may have other servers, so another part layout.
        worker = api.session().worker
        frames = [_Framed(name, arr, worker) for name, arr in named]
        self._frames = {f.name: f for f in frames}
        self._specs = {f.name: self._spec_of(f) for f in frames}
        self._ef = _core().ErrorFeedback() if any(self._specs.values()) else None
        self.session = api.session()
        root = api.rank() == 0
        core = _core()
        handles = []
        for f, (_name, arr) in zip(frames, named):
            if root:
                f.pack(arr, core.OUTER_INIT, self.round, self.config)
            handles.append((f.name, self._start(f, MODE_INIT, root)))
        self._wait(handles)
        rounds = {f.unpack(arr, None, self.what) for f, (_n, arr) in zip(frames, named)}
        if len(rounds) != 1:
            raise FastPSError(f"{self.what}: the servers hold parameters at outer rounds {rounds}")
        self.round = rounds.pop()

    def step(self, named: Sequence[Tuple[str, np.ndarray, np.ndarray]]) -> None:
        """One outer round: for each (name, delta, out) pushes ``delta`` (this worker's
        parameters minus those of the last outer step) and writes the parameters after the
        servers' outer step into ``out``. Blocks until every worker's delta is in."""
        self.start(named)
        self.finish()

    @property
    def in_flight(self) -> bool:
        """Whether a round started by :meth:`start` has not been finished yet."""
        return self._pending is not None

    def start(self, named: Sequence[Tuple[str, np.ndarray, np.ndarray]]) -> None:
        """Starts the outer round :meth:`step` describes and returns at once: the deltas are
        packed (so the caller may change them), the exchange runs in the core's threads, and
        each ``out`` is written by :meth:`finish`; keep the ``out`` arrays alive and
        unread until then. One round at a time."""
        if self._pending is not None:
            raise FastPSError(
                f"{self.what}: outer round {self.round} is still in flight (finish it first)"
            )
        if self._alone():
            # No servers: the rule runs here and now; finish() has nothing to wait for.
            for name, delta, out in named:
                opt, master = self._local[name]
                mean = np.array(delta, dtype=np.float64).reshape(-1)
                opt.step(master.ctypes.data, mean.ctypes.data, master.size)
                out.reshape(-1)[:] = master.astype(out.dtype)
            self._pending = ([], [])
            return
        if self.session is not api.session():
            raise FastPSError(
                f"{self.what}: the servers of this session hold no parameters: init first"
            )
        core = _core()
        handles = []
        frames = []
        for name, delta, out in named:
            f = self._frames.get(name)
            if f is None:
                raise FastPSError(f"{self.what}: parameter '{name}' was never initialized")
            spec = self._specs.get(name, "")
            if spec:
                f.pack_compressed(delta, self.round, self.config, spec, self._ef, api.rank())
            else:
                f.pack(delta, core.OUTER_DELTA, self.round, self.config)
            frames.append((f, out))
            handles.append((name, self._start(f, MODE_UPDATE, True)))
        self._pending = (frames, handles)

    def finish(self) -> None:
        """Waits for the round :meth:`start` began (the core's op timeout) and writes the
        parameters after the servers' outer step into each ``out``."""
        if self._pending is None:
            raise FastPSError(f"{self.what}: no outer round is in flight")
        frames, handles = self._pending
        self._pending = None  # a failed wait leaves no round to finish again
        self._wait(handles)
        for f, out in frames:
            f.unpack(out, self.round + 1, self.what)
        self.round += 1

    def abandon(self) -> None:
        """Forgets a round in flight without waiting (its session is gone: an elastic
        reset); the frames are laid out again by the next :meth:`init`."""
        self._pending = None

    def _spec_of(self, f: _Framed) -> str:
        if self.compression is None:
            return ""
        spec = _compression.spec_for(
            self.compression, f.core_name, int(np.prod(f.shape)) * f.dtype.itemsize, str(f.dtype)
        )
        return _compression.canonical_spec(spec) if spec else ""

    def delta_bytes(self) -> int:
        """The bytes one outer step pushes (headers included, frame headers not), with this
        exchange's compression: what the socket counters should see per step."""
        return sum(f.wire_bytes(self._specs.get(n, "")) for n, f in self._frames.items())

    def read(self, named: Sequence[Tuple[str, np.ndarray]]) -> None:
        """Overwrites each array with the parameters the servers hold (no update)."""
        if self._alone():
            for name, arr in named:
                arr.reshape(-1)[:] = self._local[name][1].astype(arr.dtype)
            return
        handles = []
        for name, _arr in named:
            f = self._frames[name]
            handles.append((name, self._start(f, MODE_READ, False)))
        self._wait(handles)
        for name, arr in named:
            self._frames[name].unpack(arr, self.round, self.what)


def local_sgd_repr(who: str, H: int, config: OuterConfig, compression: Any) -> str:
    """A LocalSGD's repr, the same in every plugin (``compression`` shown when set)."""
    extra = f", compression={compression!r}" if compression is not None else ""
    return (
        f"{who}(H={H}, outer_lr={config.lr}, momentum={config.momentum}, "
        f"nesterov={config.nesterov}{extra})"
    )


class OuterRounds:
    """The worker's side of local SGD and DiLoCo for any framework: each parameter's host
    array (the values the exchange reads and writes), its anchor (the parameters every delta
    is taken from) and the rounds against the servers, synchronous or overlapped.

    The plugin owns the framework side: ``stage()`` copies the framework's parameters into
    the host arrays (a no-op where a host array is the parameter's own memory) and ``load()``
    copies them back; both are called around every change here.

    ``overlap``: a round's exchange runs while the next local steps do; its answer is applied
    at the next round keeping the progress made meanwhile (x <- answer + x - x at the round's
    start), so the next delta is that progress (docs/guide/local-sgd.md, "Overlapped
    rounds")."""

    def __init__(
        self,
        what: str,
        config: OuterConfig,
        compression: Any = None,
        overlap: bool = False,
        warmup: int = 0,
    ) -> None:
        self.exchange = OuterExchange(what, config, compression=compression)
        self.overlap = overlap
        self.warmup = warmup  # overlap: the first rounds that are synchronous all the same
        self.local_steps = 0  # optimizer steps since the last round began
        self.outer_steps = 0  # rounds begun
        self._names: List[str] = []
        self._host: List[np.ndarray] = []
        self._anchor: List[np.ndarray] = []
        self._delta: List[np.ndarray] = []
        self._answer: List[np.ndarray] = []  # overlap: where a round's answer lands
        self._rebase = False

    def bind(self, named_hosts: Sequence[Tuple[str, np.ndarray]]) -> None:
        """The parameters' names and host arrays (kept; the arrays are written in place)."""
        self._names = [n for n, _a in named_hosts]
        self._host = [a for _n, a in named_hosts]
        self._anchor = [a.copy() for a in self._host]
        self._delta = [np.empty_like(a) for a in self._host]
        self._answer = []

    @property
    def synced(self) -> bool:
        """Whether every replica holds the same parameters now."""
        return self.local_steps == 0 and not self.exchange.in_flight

    def reset(self, stage: Any, load: Any) -> None:
        """Rank 0's parameters become every worker's and the servers' (a fresh outer state);
        a round in flight is waited for first (every rank takes part in it; its answer is
        void)."""
        if self.exchange.in_flight:
            self.exchange.finish()
        self._rebase = False
        stage()
        self.exchange.init(list(zip(self._names, self._host)))
        load()
        for anchor, host in zip(self._anchor, self._host):
            anchor[...] = host
        self.local_steps = 0

    def on_reset(self) -> None:
        """An elastic reset: the local steps count from zero; under overlap the round in
        flight died with its session, and the next delta counts from the parameters the
        state's sync restores (taken at the next :meth:`rebase_if_reset`)."""
        self.local_steps = 0
        if self.overlap:
            self.exchange.abandon()
            self._rebase = True

    def rebase_if_reset(self, stage: Any) -> None:
        """Before the first step after an elastic reset (overlap): anchor = the parameters."""
        if self._rebase:
            self._rebase = False
            stage()
            for anchor, host in zip(self._anchor, self._host):
                anchor[...] = host

    def after_step(self, stage: Any, load: Any, H: int) -> None:
        """Counts a local step; every ``H``-th begins a round."""
        self.local_steps += 1
        if self.local_steps >= H:
            if self.overlap and self.outer_steps >= self.warmup:
                self._overlapped_round(stage, load)
            else:
                self.sync(stage, load)

    def sync(self, stage: Any, load: Any) -> None:
        """A blocking round: afterwards every replica holds the same parameters (under
        overlap, the round in flight is landed first, and none is taken if no step came
        since it began)."""
        landed = self.exchange.in_flight
        if landed:
            self._land(stage, load)
            if self.local_steps == 0:
                return  # every replica holds that round's answer
        self._take_deltas(None if landed else stage)
        self.exchange.step(list(zip(self._names, self._delta, self._host)))
        load()
        for anchor, host in zip(self._anchor, self._host):
            anchor[...] = host
        self.local_steps = 0
        self.outer_steps += 1

    def _take_deltas(self, stage: Any) -> None:
        """Each delta: host minus anchor (``stage`` None: the host arrays are current)."""
        if stage is not None:
            stage()
        for host, anchor, delta in zip(self._host, self._anchor, self._delta):
            np.subtract(host, anchor, out=delta)
        if self.exchange.session is not None and self.exchange.session is not api.session():
            # An elastic membership change brought new servers holding nothing: they start
            # from rank 0's anchor (the survivors' common last outer step), then take this
            # round's deltas; the outer momentum restarts from zero.
            self.exchange.init(list(zip(self._names, self._anchor)))

    def _land(self, stage: Any, load: Any) -> None:
        """Waits for the round in flight and moves onto its answer, keeping the progress
        made since it began; the anchor becomes the answer."""
        self.exchange.finish()
        stage()
        for host, anchor, answer in zip(self._host, self._anchor, self._answer):
            host -= anchor  # anchor: x when the round began
            host += answer
            anchor[...] = answer
        load()

    def _overlapped_round(self, stage: Any, load: Any) -> None:
        landed = self.exchange.in_flight
        if landed:
            self._land(stage, load)
        self._take_deltas(None if landed else stage)
        if not self._answer:
            self._answer = [np.empty_like(a) for a in self._host]
        self.exchange.start(list(zip(self._names, self._delta, self._answer)))
        for anchor, host in zip(self._anchor, self._host):
            anchor[...] = host  # x at this round's start, for _land
        self.local_steps = 0
        self.outer_steps += 1


class LocalSGDRounds:
    """What every plugin's ``LocalSGD`` does with its :class:`OuterRounds` (mixed in ahead
    of the plugin's ``Algorithm``): the step counters, ``synced``, and the hooks and calls
    that only forward. The plugin builds ``_rounds`` and ``_slots`` in its setup (each slot
    with ``stage()``, its parameter into its host array, and ``load()``, back) and names
    ``_not_set_up`` (what to do first, in its words)."""

    H: int
    overlap: bool
    overlap_warmup: int = 0
    config: OuterConfig
    _rounds: Optional[OuterRounds] = None
    _not_set_up = "build the distributed optimizer"

    def __repr__(self) -> str:
        compression = getattr(self, "compression", None)
        text = local_sgd_repr(type(self).__name__, self.H, self.config, compression)
        if not self.overlap:
            return text
        warmup = f", overlap_warmup={self.overlap_warmup}" if self.overlap_warmup else ""
        return text[:-1] + f", overlap=True{warmup})"

    @property
    def local_steps(self) -> int:
        """Optimizer steps since the last outer step began."""
        return self._rounds.local_steps if self._rounds is not None else 0

    @property
    def outer_steps(self) -> int:
        """Outer steps begun."""
        return self._rounds.outer_steps if self._rounds is not None else 0

    @property
    def synced(self) -> bool:
        """Whether every replica holds the same parameters now: no local step since the
        last outer step and (``overlap``) no round in flight. :meth:`outer_step` makes it so."""
        return self._rounds is None or self._rounds.synced

    _slots: Sequence[Any] = ()  # the plugin's, each with stage() and load()

    def _stage(self) -> None:
        for s in self._slots:
            s.stage()

    def _load(self) -> None:
        for s in self._slots:
            s.load()

    def _ready(self) -> OuterRounds:
        if self._rounds is None:
            name = type(self).__name__
            raise FastPSError(f"algorithm {name}: not set up ({self._not_set_up})")
        return self._rounds

    def before_backward(self) -> None:
        self._ready().rebase_if_reset(self._stage)

    def after_step(self) -> None:
        self._ready().after_step(self._stage, self._load, self.H)

    def on_reset(self) -> None:
        """An elastic reset callback (``state.register_reset_callbacks([algo.on_reset])``):
        the state rolls back to the last commit, which the loop takes right after an outer
        step (``local_steps == 0``), so the local steps count from zero again; the new
        generation's servers are started at the next outer step. ``overlap``: the round in
        flight died with its session; the next delta counts from the parameters the state's
        sync restores (rank 0's)."""
        if self._rounds is not None:
            self._rounds.on_reset()

    def reset_parameters(self) -> None:
        """Rank 0's parameters become every worker's and the servers' (the outer optimizer
        starts afresh: no momentum). Called at setup; call it on every rank after changing
        the parameters outside training (e.g. rank 0 loaded a checkpoint)."""
        self._ready().reset(self._stage, self._load)

    def outer_step(self) -> None:
        """Pushes this worker's delta since the last outer step and loads the parameters
        after the servers' outer step (every rank must call it alike). ``overlap``: first
        lands the round in flight, then syncs the steps since it began, if any, so that
        afterwards every replica holds the same parameters."""
        self._ready().sync(self._stage, self._load)
