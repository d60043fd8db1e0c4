"""One interface over every way of calling a collective, so one worker script checks the
same collectives through the framework-neutral layer and through each plugin.

An adapter takes and returns numpy arrays (bfloat16 as float32 values); inside, the torch
and TensorFlow adapters convert to tensors and call ``fastps.torch`` / ``fastps.tensorflow``,
the MXNet adapter converts to NDArrays and calls ``fastps.mxnet``, the layer adapter calls
``fastps.collectives`` directly.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np


class LayerAdapter:
    """``fastps.collectives`` on numpy arrays."""

    name = "layer"

    def __init__(self) -> None:
        import fastps
        from fastps.collectives import ops as C

        self.C = C
        fastps.init()
        C.start_session()
        self.rank, self.size = fastps.rank(), fastps.size()
        self.global_set = C.global_process_set
        self.dtypes = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"]

    def _np(self, a: np.ndarray, dtype: str) -> np.ndarray:
        return np.ascontiguousarray(a.astype(self.C.DTYPES[dtype]))

    def allreduce_async(
        self,
        a: np.ndarray,
        dtype: str,
        op: int,
        pre: float = 1.0,
        post: float = 1.0,
        ps: Any = None,
        name: Optional[str] = None,
    ) -> Any:
        return _Wrapped(
            self.C.allreduce_async(
                self._np(a, dtype), dtype, name, self.C.ReduceOp(op), pre, post, ps
            )
        )

    def allreduce(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.allreduce_async(*args, **kwargs).synchronize()

    def grouped_allreduce(
        self, arrays: Sequence[np.ndarray], dtype: str, op: int, ps: Any = None
    ) -> List[np.ndarray]:
        ops = self.C.grouped_allreduce_async(
            [self._np(a, dtype) for a in arrays],
            [dtype] * len(arrays),
            None,
            self.C.ReduceOp(op),
            process_set=ps,
        )
        return [o.synchronize() for o in ops]

    def allgather(
        self, a: np.ndarray, dtype: str, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        return self.C.allgather_async(self._np(a, dtype), dtype, name, ps).synchronize()[0]

    def broadcast(
        self, a: np.ndarray, dtype: str, root: int, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        return self.C.broadcast_async(self._np(a, dtype), dtype, root, name, ps).synchronize()

    def alltoall(
        self, a: np.ndarray, dtype: str, splits: Optional[List[int]], ps: Any = None
    ) -> Tuple[np.ndarray, List[int]]:
        data, received = self.C.alltoall_async(
            self._np(a, dtype), dtype, splits, None, ps
        ).synchronize()
        return data, list(received)

    def reducescatter(self, a: np.ndarray, dtype: str, op: int, ps: Any = None) -> np.ndarray:
        return self.C.reducescatter_async(
            self._np(a, dtype), dtype, None, self.C.ReduceOp(op), process_set=ps
        ).synchronize()

    def add_process_set(self, ranks: List[int]) -> Any:
        return self.C.add_process_set(ranks)

    def remove_process_set(self, ps: Any) -> bool:
        return self.C.remove_process_set(ps)

    def barrier(self, ps: Any = None) -> None:
        self.C.barrier(ps)

    def join(self) -> int:
        return self.C.join()

    def allgather_object(self, obj: Any) -> List[Any]:
        return self.C.allgather_object(obj)

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return self.C.broadcast_object(obj, root)

    def shutdown(self) -> None:
        self.C.end_session()


class TorchAdapter:
    """``fastps.torch`` (tensors in, tensors out), seen through numpy."""

    name = "torch"

    def __init__(self) -> None:
        import fastps.torch as hvd
        import torch

        self.hvd, self.torch = hvd, torch
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.global_set = hvd.global_process_set
        self.dtypes = [
            "float32",
            "float64",
            "float16",
            "bfloat16",
            "int32",
            "int64",
            "int8",
            "uint8",
        ]

    def _t(self, a: np.ndarray, dtype: str) -> Any:
        torch = self.torch
        t = torch.from_numpy(np.ascontiguousarray(a.astype(np.float64)))
        return t.to(getattr(torch, dtype))

    def _n(self, t: Any) -> np.ndarray:
        if t.dtype == self.torch.bfloat16:
            t = t.float()
        return t.numpy()

    def allreduce_async(
        self,
        a: np.ndarray,
        dtype: str,
        op: int,
        pre: float = 1.0,
        post: float = 1.0,
        ps: Any = None,
        name: Optional[str] = None,
    ) -> Any:
        h = self.hvd.allreduce_async(
            self._t(a, dtype),
            name=name,
            op=op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=ps,
        )
        return _Wrapped(h, self._n)

    def allreduce(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.allreduce_async(*args, **kwargs).synchronize()

    def grouped_allreduce(
        self, arrays: Sequence[np.ndarray], dtype: str, op: int, ps: Any = None
    ) -> List[np.ndarray]:
        out = self.hvd.grouped_allreduce([self._t(a, dtype) for a in arrays], op=op, process_set=ps)
        return [self._n(t) for t in out]

    def allgather(
        self, a: np.ndarray, dtype: str, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        return self._n(self.hvd.allgather(self._t(a, dtype), name=name, process_set=ps))

    def broadcast(
        self, a: np.ndarray, dtype: str, root: int, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        return self._n(self.hvd.broadcast(self._t(a, dtype), root, name=name, process_set=ps))

    def alltoall(
        self, a: np.ndarray, dtype: str, splits: Optional[List[int]], ps: Any = None
    ) -> Tuple[np.ndarray, List[int]]:
        torch = self.torch
        sp = None if splits is None else torch.tensor(splits, dtype=torch.int32)
        out = self.hvd.alltoall(self._t(a, dtype), splits=sp, process_set=ps)
        if splits is None:
            n = ps.size() if ps is not None else self.size
            return self._n(out), [out.shape[0] // n] * n
        return self._n(out[0]), [int(x) for x in out[1]]

    def reducescatter(self, a: np.ndarray, dtype: str, op: int, ps: Any = None) -> np.ndarray:
        return self._n(self.hvd.reducescatter(self._t(a, dtype), op=op, process_set=ps))

    def add_process_set(self, ranks: List[int]) -> Any:
        return self.hvd.add_process_set(ranks)

    def remove_process_set(self, ps: Any) -> bool:
        return self.hvd.remove_process_set(ps)

    def barrier(self, ps: Any = None) -> None:
        self.hvd.barrier(process_set=ps)

    def join(self) -> int:
        return self.hvd.join()

    def allgather_object(self, obj: Any) -> List[Any]:
        return self.hvd.allgather_object(obj)

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return self.hvd.broadcast_object(obj, root)

    def shutdown(self) -> None:
        self.hvd.shutdown()


class MXNetAdapter:
    """``fastps.mxnet`` (NDArrays in, NDArrays out), seen through numpy."""

    name = "mxnet"

    def __init__(self) -> None:
        import fastps.mxnet as hvd
        import mxnet as mx

        self.hvd, self.mx = hvd, mx
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.global_set = hvd.global_process_set
        self.dtypes = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"]

    def _t(self, a: np.ndarray, dtype: str) -> Any:
        return self.mx.nd.array(np.asarray(a, dtype=np.float64), dtype=dtype)

    def _n(self, t: Any) -> np.ndarray:
        return t.asnumpy()

    def _ps(self, ps: Any) -> Any:
        return self.global_set if ps is None else ps

    def allreduce_async(
        self,
        a: np.ndarray,
        dtype: str,
        op: int,
        pre: float = 1.0,
        post: float = 1.0,
        ps: Any = None,
        name: Optional[str] = None,
    ) -> Any:
        h = self.hvd.allreduce_async(
            self._t(a, dtype),
            name=name,
            op=op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=self._ps(ps),
        )
        return _Wrapped(h, self._n)

    def allreduce(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.allreduce_async(*args, **kwargs).synchronize()

    def grouped_allreduce(
        self, arrays: Sequence[np.ndarray], dtype: str, op: int, ps: Any = None
    ) -> List[np.ndarray]:
        out = self.hvd.grouped_allreduce(
            [self._t(a, dtype) for a in arrays], op=op, process_set=self._ps(ps)
        )
        return [self._n(t) for t in out]

    def allgather(
        self, a: np.ndarray, dtype: str, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        return self._n(self.hvd.allgather(self._t(a, dtype), name=name, process_set=self._ps(ps)))

    def broadcast(
        self, a: np.ndarray, dtype: str, root: int, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        out = self.hvd.broadcast(self._t(a, dtype), root, name=name, process_set=self._ps(ps))
        return self._n(out)

    def alltoall(
        self, a: np.ndarray, dtype: str, splits: Optional[List[int]], ps: Any = None
    ) -> Tuple[np.ndarray, List[int]]:
        mx = self.mx
        sp = None if splits is None else mx.nd.array(splits, dtype="int32")
        out = self.hvd.alltoall(self._t(a, dtype), splits=sp, process_set=self._ps(ps))
        if splits is None:
            n = self._ps(ps).size()
            return self._n(out), [out.shape[0] // n] * n
        return self._n(out[0]), [int(x) for x in out[1].asnumpy()]

    def reducescatter(self, a: np.ndarray, dtype: str, op: int, ps: Any = None) -> np.ndarray:
        return self._n(self.hvd.reducescatter(self._t(a, dtype), op=op, process_set=self._ps(ps)))

    def add_process_set(self, ranks: List[int]) -> Any:
        return self.hvd.add_process_set(ranks)

    def remove_process_set(self, ps: Any) -> bool:
        return self.hvd.remove_process_set(ps)

    def barrier(self, ps: Any = None) -> None:
        self.hvd.barrier(process_set=self._ps(ps))

    def join(self) -> int:
        return self.hvd.join()

    def allgather_object(self, obj: Any) -> List[Any]:
        return self.hvd.allgather_object(obj)

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return self.hvd.broadcast_object(obj, root)

    def shutdown(self) -> None:
        self.hvd.shutdown()


class TensorFlowAdapter:
    """``fastps.tensorflow`` (eager tensors in, tensors out), seen through numpy. Every
    other allreduce runs inside a ``tf.function``, so the graph path is checked too."""

    name = "tensorflow"

    def __init__(self) -> None:
        import fastps.tensorflow as hvd
        import tensorflow as tf

        self.hvd, self.tf = hvd, tf
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.global_set = hvd.global_process_set
        self.dtypes = [
            "float32",
            "float64",
            "float16",
            "bfloat16",
            "int32",
            "int64",
            "int8",
            "uint8",
        ]
        self._graph_allreduce = tf.function(
            lambda t, op, pre, post: hvd.allreduce(
                t, op=op, prescale_factor=pre, postscale_factor=post
            ),
            reduce_retracing=True,
        )
        self._calls = 0

    def _t(self, a: np.ndarray, dtype: str) -> Any:
        tf = self.tf
        return tf.cast(tf.constant(np.asarray(a, dtype=np.float64)), getattr(tf, dtype))

    def _n(self, t: Any) -> np.ndarray:
        return self.tf.cast(t, self.tf.float64).numpy()

    def allreduce_async(
        self,
        a: np.ndarray,
        dtype: str,
        op: int,
        pre: float = 1.0,
        post: float = 1.0,
        ps: Any = None,
        name: Optional[str] = None,
    ) -> Any:
        h = self.hvd.allreduce_async(
            self._t(a, dtype),
            name=name,
            op=op,
            prescale_factor=pre,
            postscale_factor=post,
            process_set=ps,
        )
        return _Wrapped(h, self._n)

    def allreduce(
        self,
        a: np.ndarray,
        dtype: str,
        op: int,
        pre: float = 1.0,
        post: float = 1.0,
        ps: Any = None,
        name: Optional[str] = None,
    ) -> np.ndarray:
        # The per-dtype checks (shape (3, 4)) alternate between eager and tf.function. The
        # error checks stay eager: there ranks call different ops, and an unnamed op in a
        # graph is named after its input tensor, an eager one by call order (Horovod's rule),
        # so a graph op on one rank never meets an eager one on another.
        self._calls += 1
        if ps is None and name is None and np.shape(a) == (3, 4) and self._calls % 2 == 0:
            try:
                return self._n(self._graph_allreduce(self._t(a, dtype), op, pre, post))
            except self.tf.errors.OpError as exc:
                # Inside a graph, a Python error comes back as a TensorFlow error carrying
                # its message (UnknownError from tf.numpy_function); eagerly the plugin
                # raises its own types, which are also RuntimeErrors.
                raise RuntimeError(exc.message) from None
        return self.allreduce_async(a, dtype, op, pre, post, ps, name).synchronize()

    def grouped_allreduce(
        self, arrays: Sequence[np.ndarray], dtype: str, op: int, ps: Any = None
    ) -> List[np.ndarray]:
        out = self.hvd.grouped_allreduce([self._t(a, dtype) for a in arrays], op=op, process_set=ps)
        return [self._n(t) for t in out]

    def allgather(
        self, a: np.ndarray, dtype: str, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        return self._n(self.hvd.allgather(self._t(a, dtype), name=name, process_set=ps))

    def broadcast(
        self, a: np.ndarray, dtype: str, root: int, ps: Any = None, name: Optional[str] = None
    ) -> np.ndarray:
        return self._n(self.hvd.broadcast(self._t(a, dtype), root, name=name, process_set=ps))

    def alltoall(
        self, a: np.ndarray, dtype: str, splits: Optional[List[int]], ps: Any = None
    ) -> Tuple[np.ndarray, List[int]]:
        if splits is None:
            out = self.hvd.alltoall(self._t(a, dtype), process_set=ps)
            n = ps.size() if ps is not None else self.size
            return self._n(out), [out.shape[0] // n] * n
        out, received = self.hvd.alltoall(self._t(a, dtype), splits=splits, process_set=ps)
        return self._n(out), [int(x) for x in received.numpy()]

    def reducescatter(self, a: np.ndarray, dtype: str, op: int, ps: Any = None) -> np.ndarray:
        return self._n(self.hvd.reducescatter(self._t(a, dtype), op=op, process_set=ps))

    def add_process_set(self, ranks: List[int]) -> Any:
        return self.hvd.add_process_set(ranks)

    def remove_process_set(self, ps: Any) -> bool:
        return self.hvd.remove_process_set(ps)

    def barrier(self, ps: Any = None) -> None:
        self.hvd.barrier(process_set=ps)

    def join(self) -> int:
        return int(self.hvd.join())

    def allgather_object(self, obj: Any) -> List[Any]:
        return self.hvd.allgather_object(obj)

    def broadcast_object(self, obj: Any, root: int) -> Any:
        return self.hvd.broadcast_object(obj, root)

    def shutdown(self) -> None:
        self.hvd.shutdown()


class _Wrapped:
    """A handle whose result comes back as numpy."""

    def __init__(self, handle: Any, convert: Any = None) -> None:
        self.handle, self.convert = handle, convert

    def poll(self) -> bool:
        return bool(self.handle.poll())

    def synchronize(self) -> np.ndarray:
        out = self.handle.synchronize()
        return self.convert(out) if self.convert else out


ADAPTERS = {
    "layer": LayerAdapter,
    "torch": TorchAdapter,
    "mxnet": MXNetAdapter,
    "tensorflow": TensorFlowAdapter,
}
