"""A collective inside a graph: its start op, its finish op, and how the finish waits.

In a graph a collective is two ops. **Start** runs as soon as its inputs exist: it hands
their arrays to ``fastps.collectives`` (which never waits) and outputs an ``int64`` id of
the started work. **Finish** outputs the result arrays, so it must wait for the other
ranks. Without kernels compiled against TensorFlow, a Python op cannot wait without
holding one of the executor's inter-op threads, and that can deadlock: when a rank's
threads all sit in finishes whose collectives another rank has not started, and that
rank's threads sit in finishes of collectives the first one has not started, neither gets
to run a start again. How this module avoids it depends on the graph:

* **Ordered graphs** (``tf.function`` bodies): TensorFlow's automatic control
  dependencies chain stateful ops in creation order, so every rank runs the starts and
  finishes of a function in the same order, and a finish only waits for a collective
  that every rank reaches before any later one. There the finish simply blocks.

* **Unordered graphs** (TensorFlow 1 graphs run by ``tf.compat.v1.Session``): nothing
  orders independent ops, so the finish never holds a thread. Each collective node owns
  a ``MutexV2`` resource. The start first takes its lock (``MutexLock``, one of
  TensorFlow's asynchronous kernels) and its Python function (``tf.py_function``, which
  can receive the lock tensor) keeps the lock with the started work. One waiter thread
  per process watches the works of unordered graphs; when one completes (or passes the
  op timeout) it stores the outcome and drops the lock. The finish first takes the same
  lock: TensorFlow waits for a mutex on the mutex's own thread, not on an executor
  thread, and schedules the finish once the lock is free; the finish then only fetches
  the outcome. No executor thread of any rank ever waits for another rank, so a graph
  with any number of collectives, run in any order, completes.

Both ops are ``tf.py_function``s, so that ranks that disagree fail the op with Horovod's
``FailedPreconditionError`` (see :func:`failing_outputs`) rather than ``UnknownError``.

  A mutex belongs to the session that ran its graph and is freed with it, while a lock
  the waiter still holds names it: ``Session.close`` is wrapped to drop the locks of the
  closing session's graph first (a finish that would still wait then blocks instead).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from fastps.collectives import ops as C
from fastps.errors import FastPSError, FastPSTimeoutError
from fastps.tensorflow import _engine as E
from fastps.worker import api
from fastps.worker.waitable import Waitable

# How long the waiter sleeps between polls while works are pending (doubling from the
# first to the second while nothing completes).
_MIN_PAUSE, _MAX_PAUSE = 20e-6, 2e-3


class Started:
    """One run of a start op: the started work and, once settled, its outcome."""

    def __init__(self, work: Any, label: str, graph: Any = None, lock: Any = None) -> None:
        self.work = work
        self.label = label
        self.graph = graph  # unordered graphs: the graph whose session owns the mutex
        self.lock = lock  # the MutexLock tensor the finish op waits for
        self.settled = False
        self._result: List[np.ndarray] = []
        self._error: Optional[BaseException] = None
        self._busy = threading.Lock()  # the waiter and a blocking finish never both settle

    def poll(self) -> bool:
        return self.settled or bool(self.work.poll())

    def settle(self, timeout: Optional[float] = None, limit: float = 0.0) -> bool:
        """Waiter thread: records the outcome (waiting at most ``timeout``) and frees the
        lock. False if a finish is settling it at the same moment."""
        if not self._busy.acquire(blocking=False):
            return False
        try:
            if not self.settled:
                try:
                    self._result = self.work.synchronize(timeout)
                except BaseException as exc:  # noqa: BLE001 - the finish op raises it
                    self._error = exc
                    if timeout is not None:
                        self._error = FastPSTimeoutError(
                            f"fastps op '{self.label}' did not complete within {limit:g} s: "
                            f"another rank may not have run it ({exc})"
                        )
                self.settled = True
        finally:
            self._busy.release()
            self.lock = None  # wakes the finish op
        return True

    def outcome(self) -> List[np.ndarray]:
        """Finish op: the result arrays (waiting only if the lock was dropped early)."""
        with self._busy:
            if not self.settled:
                try:
                    self._result = self.work.synchronize()
                except BaseException as exc:
                    self._error = exc
                self.settled = True
        if self._error is not None:
            raise self._error
        return self._result


class _Waiter:
    """The thread that settles the works started by unordered graphs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: List[Tuple[Started, float, float]] = []  # entry, deadline, limit
        self._thread: Optional[threading.Thread] = None

    def watch(self, entry: Started) -> None:
        limit = float(api.config().op_timeout)
        with self._cond:
            self._watched.append((entry, time.monotonic() + limit, limit))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="fastps-tf-waiter", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def release_graph(self, graph: Any) -> None:
        """Drops the locks held for ``graph``'s pending works (its session is closing)."""
        with self._cond:
            for entry, _, _ in self._watched:
                if entry.graph is graph:
                    entry.lock = None

    def _run(self) -> None:
        pause = _MIN_PAUSE
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                    pause = _MIN_PAUSE
                watched = list(self._watched)
            now = time.monotonic()
            done = set()
            for entry, deadline, limit in watched:
                try:
                    ready = entry.work.poll()
                except BaseException:  # noqa: BLE001 - synchronize raises it again
                    ready = True
                if ready:
                    settled = entry.settle()
                elif now > deadline:
                    # A tiny wait that fails withdraws this rank's announcement, as a
                    # blocking wait past the op timeout would.
                    settled = entry.settle(timeout=1e-3, limit=limit)
                else:
                    continue
                if settled:
                    done.add(id(entry))
            if done:
                with self._cond:
                    self._watched = [w for w in self._watched if id(w[0]) not in done]
                pause = _MIN_PAUSE
            else:
                time.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)


_waiter = _Waiter()
_table: Dict[int, Started] = {}
_table_lock = threading.Lock()
_ids = itertools.count(1)
_mutexes = itertools.count()


def _register(entry: Started) -> int:
    hid = next(_ids)
    with _table_lock:
        _table[hid] = entry
    return hid


def _lookup(hid: int, remove: bool) -> Started:
    with _table_lock:
        entry = _table.pop(int(hid), None) if remove else _table.get(int(hid))
    if entry is None:
        raise FastPSError(f"fastps operation {hid} is unknown or was already synchronized")
    return entry


def poll(hid: int) -> bool:
    return _lookup(hid, remove=False).poll()


def ordered(graph: Any) -> bool:
    """True for graphs whose stateful ops TensorFlow chains in creation order."""
    return bool(getattr(graph, "_add_control_dependencies", False))


_sessions_guarded = False


def _guard_sessions() -> None:
    """Wraps ``Session.close`` once so that the locks a closing session's mutexes name
    are dropped while those mutexes still exist (see the module docstring)."""
    global _sessions_guarded
    if _sessions_guarded:
        return
    from tensorflow.python.client import session as tf_session

    base = tf_session.BaseSession
    original = base.close

    def close(self: Any) -> None:
        _waiter.release_graph(self.graph)
        original(self)

    close.__doc__ = original.__doc__
    base.close = close
    _sessions_guarded = True


class GraphStart:
    """A start op's id tensor, and the mutex its finish waits on (unordered graphs)."""

    def __init__(self, hid: tf.Tensor, mutex: Optional[tf.Tensor]) -> None:
        self.hid = hid
        self.mutex = mutex


def start_op(starter: Callable[..., Any], inputs: Sequence[tf.Tensor], label: str) -> GraphStart:
    """Op that calls ``starter(*arrays)`` (returning a work with ``poll`` and
    ``synchronize(timeout)``) once ``inputs`` are ready; outputs the work's id."""
    graph = tf.compat.v1.get_default_graph()
    if ordered(graph):

        def start(*tensors: Any) -> Any:
            try:
                work = starter(*[t.numpy() for t in tensors])
            except C.CollectiveError as exc:
                return failing_outputs(E.translated(exc), [tf.int64])
            return [tf.constant(_register(Started(work, label)), tf.int64)]

        hid = tf.py_function(start, list(inputs), [tf.int64], name=E.op_name("FastPSStart", label))
        hid[0].set_shape([])
        return GraphStart(hid[0], None)

    _guard_sessions()
    graph_ref = weakref.ref(graph)

    def start_locked(lock: Any, *tensors: Any) -> Any:
        try:
            work = starter(*[t.numpy() for t in tensors])
        except C.CollectiveError as exc:
            return failing_outputs(E.translated(exc), [tf.int64])
        entry = Started(work, label, graph_ref(), lock)
        hid = _register(entry)
        _waiter.watch(entry)
        return [tf.constant(hid, tf.int64)]

    mutex = tf.raw_ops.MutexV2(
        shared_name=f"fastps.{os.getpid()}.{next(_mutexes)}", name=E.op_name("FastPSMutex", label)
    )
    lock = tf.raw_ops.MutexLock(mutex=mutex, name=E.op_name("FastPSLock", label))
    hid = tf.py_function(
        start_locked, [lock, *inputs], [tf.int64], name=E.op_name("FastPSStart", label)
    )
    hid[0].set_shape([])
    return GraphStart(hid[0], mutex)


def finish_op(
    start: GraphStart, dtypes: Sequence[tf.DType], shapes: Sequence[Any], label: str
) -> List[tf.Tensor]:
    """Op that outputs the arrays of the work ``start`` started (waiting as the module
    docstring describes)."""
    dtypes = list(dtypes)

    def finish(h: Any) -> List[Any]:
        try:
            arrays = _lookup(int(h), remove=True).outcome()
        except C.CollectiveError as exc:
            return failing_outputs(E.translated(exc), dtypes)
        return [tf.convert_to_tensor(a, dtype=dt) for a, dt in zip(arrays, dtypes)]

    deps: List[Any] = []
    if start.mutex is not None:
        with tf.control_dependencies([start.hid]):
            # Taken once the start's lock is dropped; released at once (nothing holds it).
            deps.append(
                tf.raw_ops.MutexLock(mutex=start.mutex, name=E.op_name("FastPSWait", label))
            )
    with tf.control_dependencies(deps):
        outs = tf.py_function(finish, [start.hid], dtypes, name=E.op_name("FastPSFinish", label))
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return list(outs)


class _AnyDevice:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def failing_outputs(exc: BaseException, dtypes: Sequence[tf.DType]) -> List[Any]:
    """What a ``tf.py_function`` returns to fail its op with ``FailedPreconditionError``
    carrying ``exc``'s message: Horovod's error type when ranks disagree.

    An exception raised in a py_function fails the op with ``UnknownError`` (TensorFlow
    maps only ValueError, TypeError and a few others to other codes). What TensorFlow does
    report as ``FailedPrecondition`` is an output list holding a ``tf.Tensor`` that is not
    an eager tensor, naming that object's type; so each output here is an instance of a
    throwaway Tensor subclass named after the message ("Expected EagerTensor, found
    PyObject of type: MismatchError: op 'x': mismatched shape: rank 0 has [17], ...").
    """
    from tensorflow.python.framework import tensor as tensor_lib

    message = f"{type(exc).__name__}: {exc}".replace("\0", "")
    outs: List[Any] = []
    for dtype in dtypes:
        attrs = {"dtype": dtype, "backing_device": _AnyDevice(), "_copy": lambda self: self}
        outs.append(object.__new__(type(message, (tensor_lib.Tensor,), attrs)))
    return outs


def call_op(
    fn: Callable[[], Sequence[np.ndarray]],
    dtypes: Sequence[tf.DType],
    shapes: Sequence[Any],
    label: str,
    after: Sequence[Any] = (),
) -> List[tf.Tensor]:
    """Start and finish ops around a blocking call without inputs (a join, a check):
    ``fn`` runs on its own thread, so the start returns at once."""
    with tf.control_dependencies(list(after)):
        start = start_op(lambda: ThreadWork(fn, label), [], label)
    return finish_op(start, dtypes, shapes, label)


class ThreadWork(Waitable):
    """Work done by a blocking call on a thread of its own."""

    def __init__(self, fn: Callable[[], Sequence[np.ndarray]], label: str) -> None:
        self._label = label
        self._done = threading.Event()
        self._result: List[np.ndarray] = []
        self._error: Optional[BaseException] = None

        def run() -> None:
            try:
                self._result = list(fn())
            except BaseException as exc:  # noqa: BLE001 - synchronize raises it
                self._error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name=f"fastps-{label}", daemon=True).start()

    def poll(self) -> bool:
        return self._done.is_set()

    def synchronize(self, timeout: Optional[float] = None) -> List[np.ndarray]:
        limit = timeout or float(api.config().op_timeout)
        if not self._done.wait(limit):
            raise FastPSTimeoutError(f"'{self._label}' did not complete within {limit:g} s")
        if self._error is not None:
            raise E.translated(self._error)
        return self._result

    wait = synchronize


class DoneWork(Waitable):
    """Work that needed no waiting: its result is known when it starts."""

    def __init__(self, result: Sequence[np.ndarray]) -> None:
        self._result = list(result)

    def poll(self) -> bool:
        return True

    def synchronize(self, timeout: Optional[float] = None) -> List[np.ndarray]:
        return self._result

    wait = synchronize


def check_op(kind: str, group: E.Group, what: str) -> Optional[tf.Tensor]:
    """The graph form of :func:`_engine.check_same_everywhere`: an op that checks on its
    first run in a core session (later runs return at once, without a thread). Whether
    the check is needed is decided when the op runs, never when the graph is traced: a
    graph traced after this rank checked may run where another rank has not (in an
    elastic job, a graph traced in one generation runs in the next, where every rank,
    newcomers included, checks again; a graph without the op would leave the newcomers'
    check waiting for ranks that never come). None only for a process that runs alone in
    a world that cannot grow."""
    if C.global_process_set.size() == 1 and not E.world_may_change():
        return None
    label = f"check.{kind}"

    def check() -> List[np.ndarray]:
        E.check_same_everywhere(kind, group, what)
        return [np.array(True)]

    def start() -> Any:
        if E.already_checked(kind, group):
            return DoneWork([np.array(True)])
        return ThreadWork(check, label)

    return finish_op(start_op(start, [], label), [tf.bool], [[]], label)[0]
