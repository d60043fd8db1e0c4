"""DistributedGradientTape: a tf.GradientTape whose gradients are averaged over all workers."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import tensorflow as tf
from fastps.tensorflow import _engine as E
from fastps.tensorflow import ops as O
from fastps.tensorflow import sfb as SFB
from fastps.tensorflow._reducer import GradientReducer
from fastps.tensorflow.compression import Compression, Compressor

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape``; :meth:`gradient` returns gradients averaged (or summed,
    ``op=Sum``) over all workers.

    Either wrap a tape after recording, Horovod style::

        with tf.GradientTape() as tape:
            loss = ...
        tape = fastps.tensorflow.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    or record with it directly: ``with DistributedGradientTape() as tape: ...``.

    Each gradient is pushed with a priority from the tape's watched-variable order (the
    variable TensorFlow saw first gets the highest priority; TensorFlow lists watched
    variables in creation order, which for Keras layers is forward order). Sources the tape
    did not watch come after, in the order given. Inside ``tf.function`` the push_pulls
    start as backpropagation produces the gradients (see ``fastps.tensorflow._reducer``).
    ``sparse_as_dense=True`` sends ``tf.IndexedSlices`` gradients as dense tensors;
    otherwise they are gathered. ``num_groups=k`` bundles the gradients into k groups of
    one start and one wait op each inside graphs (fewer Python calls per step).
    ``process_set`` reduces among that set's ranks only. ``model``: the Keras 3 model whose
    ``Dense`` kernels may be synchronised as sufficient factors under
    ``FASTPS_SFB=auto|on`` (``sfb.py``, docs/guide/sfb.md); give the same model to every tape.
    """

    def __init__(
        self,
        gradtape: Optional[tf.GradientTape] = None,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Type[Compressor] = Compression.none,
        sparse_as_dense: bool = False,
        op: int = O.Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        process_set: Any = None,
        scale_local_gradients: bool = True,
        persistent: bool = False,
        watch_accessed_variables: bool = True,
        model: Any = None,
    ) -> None:
        # Accepted for Horovod compatibility: CPU path only; fastps orders by priority
        # instead of explicit groups.
        del device_dense, device_sparse, groups
        self._inner = (
            gradtape
            if gradtape is not None
            else tf.GradientTape(
                persistent=persistent, watch_accessed_variables=watch_accessed_variables
            )
        )
        op = O._resolve_op(op, None)
        if gradient_predivide_factor != 1.0 and op != O.Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        # Average = (sum of g / f) * f / size: the same result, with a smaller sum.
        self._reducer = GradientReducer(
            "DistributedGradientTape",
            compression=compression,
            op=op,
            sparse_as_dense=sparse_as_dense,
            prescale_factor=1.0 / gradient_predivide_factor,
            postscale_factor=gradient_predivide_factor,
            num_groups=num_groups,
            process_set=process_set,
        )

        SFB.attach(self._reducer, model, "DistributedGradientTape")
        self._local: Dict[int, None] = {}  # ids of sources whose gradients stay local
        self._scale_local = bool(scale_local_gradients)
        self._set_size = (O._ps(process_set)).size

    def _is_local(self, source: Any) -> bool:
        return id(source) in self._local or id(O._variable_of(source)) in self._local

    def register_local_source(self, source: Any) -> None:
        """Horovod's local variables: ``source``'s gradient is not reduced (model
        parallelism); with ``scale_local_gradients`` it is divided by the set size, so it
        matches the averaged gradients' scale."""
        # A Keras 3 variable's ``value`` is its tf.Variable; a tf.Variable's (Keras 2) is a
        # method, a new object per access, whose id a later object may take.
        self._local[id(O._variable_of(source))] = None
        self._local[id(source)] = None

    # The recording side is the wrapped tape's.
    def __enter__(self) -> DistributedGradientTape:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)

    def __getattr__(self, attr: str) -> Any:
        # Everything else (watch, watched_variables, stop_recording, reset, jacobian,
        # batch_jacobian) is the wrapped tape's.
        if attr == "_inner":
            raise AttributeError(attr)
        return getattr(self._inner, attr)

    @property
    def tape(self) -> tf.GradientTape:
        """The wrapped tf.GradientTape."""
        return self._inner

    def _forward_order(self, sources: Sequence[Any]) -> List[int]:
        position: Dict[int, int] = {}
        for pos, v in enumerate(self._inner.watched_variables()):
            position.setdefault(id(v), pos)
        base = len(position)
        order = []
        for i, s in enumerate(sources):
            key = id(O._variable_of(s))  # Keras 3 variables wrap a tf.Variable
            order.append(position.get(key, position.get(id(s), base + i)))
        return order

    @E.no_autograph
    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
    ) -> Any:
        grads = self._inner.gradient(
            target,
            sources,
            output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients,
        )
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        local = [self._is_local(src) for src in flat_sources]
        shared = [None if loc else g for g, loc in zip(flat_grads, local)]
        reduced = self._reducer.reduce(shared, flat_sources, self._forward_order(flat_sources))
        for i, loc in enumerate(local):
            if loc and flat_grads[i] is not None:
                g = flat_grads[i]
                reduced[i] = g / tf.cast(self._set_size(), g.dtype) if self._scale_local else g
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(
        self, target: Any, sources: Any, output_gradients: Any = None
    ) -> Tuple[List[Tuple[Any, Any]], List[Tuple[Any, Any]]]:
        """:meth:`gradient`, split into ``(local, global)`` lists of ``(source, gradient)``
        pairs: the registered local sources and the reduced ones (Horovod's method)."""
        flat_sources = tf.nest.flatten(sources)
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients))
        local: List[Tuple[Any, Any]] = []
        shared: List[Tuple[Any, Any]] = []
        for src, g in zip(flat_sources, grads):
            (local if self._is_local(src) else shared).append((src, g))
        return local, shared


def PartialDistributedGradientTape(  # noqa: N802 - Horovod's name for a factory
    gradtape: Optional[tf.GradientTape] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    op: int = O.Average,
    gradient_predivide_factor: float = 1.0,
    local_layers: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
) -> DistributedGradientTape:
    """A :class:`DistributedGradientTape` that keeps the gradients of ``local_layers``
    (Keras layers, e.g. a model-parallel part) local: they are not reduced and, with
    ``scale_local_gradients``, are divided by the set size like the averaged ones."""
    from fastps.tensorflow.optimizer import _layers  # Keras 3 or Keras 2 (tf_keras) layers, checked

    layers: List[Any] = _layers(local_layers)
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
