"""Local gradient aggregation for the Keras DistributedOptimizer (Horovod's
``backward_passes_per_step``): gradients are summed on each worker over N passes and only
every N-th pass reduces the sums over the workers and updates the variables.

Every pass adds its gradients to one accumulator per variable and counts itself. The
passes in between leave the variables alone but advance the optimizer's iteration count,
so learning rate schedules see every pass (Horovod's semantics). The N-th pass hands the
sums (divided by N with ``average_aggregated_gradients``) to the reduction and the update,
then zeroes the accumulators and the count.

Works eagerly (a Python branch) and in graphs (one ``tf.cond``: only the N-th run of the
step executes the reduction's ops, so the other passes send nothing). The accumulators are
``tf.Variable``s the optimizer does not track: they are not saved with it and are not
broadcast by ``BroadcastGlobalVariablesCallback`` (each worker's partial sum is its own).

Horovod's split form (``_compute_gradients`` then ``apply_gradients``) runs the same cycle
in two halves: :meth:`LocalAggregation.accumulate` sums and, on the N-th pass, reduces and
zeroes; :meth:`LocalAggregation.apply_if_reduced` updates only when the count is back at 0.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from fastps.tensorflow import _engine as E

__all__ = ["LocalAggregation", "check_passes"]


def check_passes(backward_passes_per_step: Any) -> int:
    """``backward_passes_per_step`` as an int >= 1, or a ValueError naming the value."""
    n = backward_passes_per_step
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(
            f"backward_passes_per_step must be an integer >= 1 (the number of passes whose "
            f"gradients are summed locally before one reduction), got {n!r}"
        )
    return int(n)


class LocalAggregation:
    """Sums gradients over ``passes`` calls of :meth:`step`; see the module docstring."""

    def __init__(self, passes: int, average: bool, sparse_as_dense: bool) -> None:
        self.passes = check_passes(passes)
        self.average = bool(average)
        self.sparse_as_dense = bool(sparse_as_dense)
        # id(variable) -> (the variable, kept alive so the id stays its own; accumulator)
        self._sums: Dict[int, Tuple[Any, tf.Variable]] = {}
        self._count: Optional[tf.Variable] = None

    @property
    def counter(self) -> tf.Variable:
        """Passes summed since the last reduction (an int64 variable; Horovod's name)."""
        if self._count is None:
            with tf.init_scope():
                self._count = tf.Variable(0, dtype=tf.int64, trainable=False, name="fastps_passes")
        return self._count

    def _dense(self, grad: Any, var: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            if not self.sparse_as_dense:
                raise ValueError(
                    f"the gradient of '{E.label_of(var)}' is sparse (tf.IndexedSlices); local "
                    "aggregation (backward_passes_per_step > 1) sums dense tensors: pass "
                    "sparse_as_dense=True"
                )
            return tf.convert_to_tensor(grad)
        return grad

    def _accumulators(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """The accumulator of every variable with a gradient (None for the others), made on
        first use outside any graph (``tf.init_scope``), like an optimizer's slots."""
        out: List[Any] = []
        for g, v in zip(grads, variables):
            if g is None:
                out.append(None)
                continue
            entry = self._sums.get(id(v))
            if entry is None:
                shape = tf.TensorShape(v.shape)
                if not shape.is_fully_defined():
                    raise ValueError(
                        f"local aggregation needs variables of known shape; "
                        f"'{E.label_of(v)}' has shape {shape}"
                    )
                with tf.init_scope():
                    acc = tf.Variable(
                        tf.zeros(shape, g.dtype), trainable=False, name="fastps_grad_sum"
                    )
                entry = self._sums[id(v)] = (v, acc)
            out.append(entry[1])
        return out

    def _add(self, grads: Sequence[Any], variables: List[Any]) -> List[Any]:
        """Adds this pass's ``grads`` to the sums and counts the pass; returns the sums
        (None where a variable has no gradient)."""
        grads = [None if g is None else self._dense(g, v) for g, v in zip(grads, variables)]
        accs = self._accumulators(grads, variables)
        for g, acc in zip(grads, accs):
            if acc is not None:
                acc.assign_add(tf.cast(g, acc.dtype))
        self.counter.assign_add(1)
        return accs

    def _reduced(
        self,
        accs: List[Any],
        variables: List[Any],
        reduce: Callable[[List[Any], List[Any]], List[Any]],
    ) -> List[Any]:
        """The sums reduced over the workers, divided by N with ``average``."""
        reduced = reduce([None if acc is None else acc.read_value() for acc in accs], variables)
        if self.average:
            reduced = [r if r is None else r / tf.cast(self.passes, r.dtype) for r in reduced]
        return reduced

    @E.no_autograph
    def step(
        self,
        grads: Sequence[Any],
        variables: Sequence[Any],
        reduce: Callable[[List[Any], List[Any]], List[Any]],
        apply: Callable[[List[Any]], Any],
        skip: Callable[[], Any],
    ) -> Any:
        """Adds ``grads`` to the sums; on the N-th pass calls ``apply(reduce(sums,
        variables))`` and zeroes the sums, otherwise ``skip()`` (which advances the
        iteration count). Returns what the taken branch returns (a bool tensor in graphs)."""
        variables = list(variables)
        accs = self._add(grads, variables)
        count = self.counter
        due = tf.greater_equal(count.read_value(), self.passes)

        def reduce_and_apply() -> Any:
            reduced = self._reduced(accs, variables, reduce)
            result = apply(reduced)
            for acc in accs:
                if acc is not None:
                    acc.assign(tf.zeros_like(acc))
            count.assign(0)
            return result

        if E.executing_eagerly():
            return reduce_and_apply() if bool(due) else skip()
        return tf.cond(due, _for_effect(reduce_and_apply), _for_effect(skip))

    @E.no_autograph
    def accumulate(
        self,
        grads: Sequence[Any],
        variables: Sequence[Any],
        reduce: Callable[[List[Any], List[Any]], List[Any]],
    ) -> List[Any]:
        """Horovod's split form (``_compute_gradients``, then ``apply_gradients``): adds
        ``grads`` to the sums and returns, on the N-th pass, the reduced sums (divided by N
        with ``average_aggregated_gradients``), after which the sums and the count are
        zeroed; on the other passes the sums so far (not reduced). :meth:`apply_if_reduced`
        then updates only after the N-th pass."""
        variables = list(variables)
        accs = self._add(grads, variables)
        count = self.counter
        present = [i for i, acc in enumerate(accs) if acc is not None]

        def reduce_and_clear() -> List[Any]:
            reduced = self._reduced(accs, variables, reduce)
            out = [tf.identity(reduced[i]) for i in present]
            # Zeroed only once the reduced values exist (they were read from the sums).
            with tf.control_dependencies(out):
                for acc in accs:
                    if acc is not None:
                        acc.assign(tf.zeros_like(acc))
                count.assign(0)
            return [tf.constant(True)] + out  # the flag: a cond branch may not be empty

        def sums_so_far() -> List[Any]:
            return [tf.constant(False)] + [accs[i].read_value() for i in present]

        if E.executing_eagerly():
            due = int(count.numpy()) >= self.passes
            values = (reduce_and_clear() if due else sums_so_far())[1:]
        else:
            due = tf.greater_equal(count.read_value(), self.passes)
            values = tf.cond(due, reduce_and_clear, sums_so_far)[1:]
        result: List[Any] = [None] * len(accs)
        for i, value in zip(present, values):
            result[i] = value
        return result

    @E.no_autograph
    def apply_if_reduced(self, apply: Callable[[], Any], skip: Callable[[], Any]) -> Any:
        """The update half of the split form: ``apply()`` when the last :meth:`accumulate`
        reduced (the count is back at 0), else ``skip()`` (which advances the iteration
        count). Returns what the taken branch returns (a bool tensor in graphs)."""
        reduced = tf.equal(self.counter.read_value(), 0)
        if E.executing_eagerly():
            return apply() if bool(reduced) else skip()
        return tf.cond(reduced, _for_effect(apply), _for_effect(skip))


def _for_effect(fn: Callable[[], Any]) -> Callable[[], tf.Tensor]:
    """``fn`` as a ``tf.cond`` branch run for its effects: both branches must return the
    same structure, whatever ``fn`` returns."""

    def branch() -> tf.Tensor:
        fn()
        return tf.constant(True)

    return branch
