"""Keras training throughput: fastps against TensorFlow's MultiWorkerMirroredStrategy.

Trains the model of examples/tensorflow/keras_digits.py (an MLP on scikit-learn's 8x8
digits) with ``model.fit`` and reports samples per second, for

* fastps: ``fastpsrun -np W`` workers, ``DistributedOptimizer`` + broadcast callback, as
  the example has it (one start and one wait op per gradient), and with ``num_groups=1``
  (one op pair for all gradients);
* MWMS: W worker processes of ``tf.distribute.MultiWorkerMirroredStrategy`` talking over
  gRPC on localhost ports (``TF_CONFIG``), the dataset auto-sharded by data;
* one process without distribution, on the same global batch, for context.

Same machine, same model, same per-worker batch, same global batch and number of steps;
runs alternate between the systems (``--repeats`` rounds) and the table shows medians.

    python benchmarks/bench_keras.py [--workers 2] [--epochs 20] [--batch-size 32] [--repeats 3]

Throughput is measured from the start of the second epoch (after tracing and warm-up) to
the end of training: samples/s = (epochs - 1) * steps per epoch * global batch / seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

MARK = "BENCH_RESULT "
HERE = os.path.abspath(__file__)


# ------------------------------------------------------------------ worker side
def _patch_keras_for_mwms() -> None:
    """Works around two Keras 3 bugs that stop ``model.fit`` under MWMS (seen with Keras
    3.15): the symbolic build reduces the first batch with ``strategy.reduce`` (which cannot
    take input batches), and the step outputs (scalars) are reduced along axis 0."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tft

    build = tft.TensorFlowTrainer._maybe_symbolic_build

    def maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        if iterator is not None and self._distribute_strategy is not None:
            for _, _, it in iterator:
                batch = next(it)
                break
            strategy = self.distribute_strategy

            def local(v: Any) -> Any:
                if isinstance(v, tf.distribute.DistributedValues):
                    return strategy.experimental_local_results(v)[0]
                return v

            return build(self, iterator=None, data_batch=tf.nest.map_structure(local, batch))
        return build(self, iterator=iterator, data_batch=data_batch)

    reduce_per_replica = tft.reduce_per_replica

    def reduce_scalars(values: Any, strategy: Any, reduction: str = "auto") -> Any:
        if reduction in ("auto", "mean") and tft._collective_all_reduce_multi_worker(strategy):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return reduce_per_replica(values, strategy, reduction)

    tft.TensorFlowTrainer._maybe_symbolic_build = maybe_symbolic_build
    tft.reduce_per_replica = reduce_scalars


def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    tf.get_logger().setLevel("ERROR")
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    role = args.role
    strategy: Optional[Any] = None
    if role == "mwms":
        _patch_keras_for_mwms()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        n = strategy.num_replicas_in_sync
        rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    elif role == "fastps":
        import fastps.tensorflow.keras as hvd

        hvd.init()
        n, rank = hvd.size(), hvd.rank()
    else:
        n, rank = 1, 0

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, _, y_train, _ = train_test_split(
        x, y.astype(np.int64), test_size=0.25, random_state=0, stratify=y
    )
    global_batch = args.batch_size * args.workers
    steps = len(x_train) // global_batch
    x_train, y_train = x_train[: steps * global_batch], y_train[: steps * global_batch]
    if role == "fastps":
        data = tf.data.Dataset.from_tensor_slices((x_train[rank::n], y_train[rank::n]))
        data = data.batch(args.batch_size, drop_remainder=True)
    else:  # MWMS shards each global batch between its workers itself
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        data = data.batch(global_batch, drop_remainder=True)
    data = data.prefetch(2)

    def build() -> Any:
        model = keras.Sequential(
            [keras.Input((64,))]
            + [keras.layers.Dense(h, activation="relu") for h in args.hidden]
            + [keras.layers.Dense(10)]
        )
        optimizer = keras.optimizers.Adam(args.lr * args.workers)
        callbacks: List[Any] = []
        if role == "fastps":
            optimizer = hvd.DistributedOptimizer(optimizer, num_groups=args.num_groups)
            callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))
        model.compile(
            optimizer=optimizer,
            jit_compile=False,
            metrics=["accuracy"],
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model, callbacks

    if strategy is not None:
        with strategy.scope():
            model, callbacks = build()
    else:
        model, callbacks = build()

    class Timer(keras.callbacks.Callback):
        start = 0.0
        end = 0.0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if epoch == 1:
                Timer.start = time.perf_counter()

        def on_train_end(self, logs: Any = None) -> None:
            Timer.end = time.perf_counter()

    history = model.fit(data, epochs=args.epochs, verbose=0, callbacks=[*callbacks, Timer()])
    elapsed = Timer.end - Timer.start
    samples = (args.epochs - 1) * steps * global_batch
    if rank == 0:
        print(
            MARK
            + json.dumps(
                {
                    "role": role,
                    "processes": n,
                    "global_batch": global_batch,
                    "steps": steps,
                    "samples_per_s": samples / elapsed,
                    "seconds": elapsed,
                    "final_loss": float(history.history["loss"][-1]),
                }
            ),
            flush=True,
        )
    if role == "fastps":
        hvd.shutdown()


# ------------------------------------------------------------------ driver side
def _worker_args(args: argparse.Namespace, role: str) -> List[str]:
    return [
        HERE,
        "--role",
        role,
        "--workers",
        str(args.workers),
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--lr",
        str(args.lr),
        "--threads",
        str(args.threads),
        "--num-groups",
        str(args.num_groups),
        "--hidden",
        *[str(h) for h in args.hidden],
    ]


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPS_")}
    env.update({"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"})
    return env


def _result(output: str, what: str) -> Dict[str, Any]:
    for line in output.splitlines():
        at = line.find(MARK)
        if at >= 0:
            return json.loads(line[at + len(MARK) :])
    raise RuntimeError(f"{what} printed no result:\n{output[-4000:]}")


def run_fastps(args: argparse.Namespace, num_groups: int = 0) -> Dict[str, Any]:
    args = argparse.Namespace(**{**vars(args), "num_groups": num_groups})
    cmd = [
        sys.executable,
        "-m",
        "fastps.launcher",
        "-np",
        str(args.workers),
        sys.executable,
        *_worker_args(args, "fastps"),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"fastps run failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return _result(p.stdout, "fastps")


def _free_ports(count: int) -> List[int]:
    socks, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("localhost", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def run_mwms(args: argparse.Namespace) -> Dict[str, Any]:
    cluster = {"worker": [f"localhost:{p}" for p in _free_ports(args.workers)]}
    procs = []
    for i in range(args.workers):
        env = dict(
            _env(),
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *_worker_args(args, "mwms")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=args.timeout)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("MWMS run failed:\n" + "\n".join(o[-3000:] for o in outputs))
    return _result(outputs[0], "MWMS")


def run_single(args: argparse.Namespace) -> Dict[str, Any]:
    p = subprocess.run(
        [sys.executable, *_worker_args(args, "single")],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=args.timeout,
    )
    if p.returncode != 0:
        raise RuntimeError(f"single-process run failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return _result(p.stdout, "single process")


def driver(args: argparse.Namespace) -> None:
    systems: List[Any] = [("fastps", run_fastps)]
    if args.grouped:
        systems.append(("fastps, num_groups=1", lambda a: run_fastps(a, num_groups=1)))
    systems += [("TF MWMS", run_mwms), ("1 process, no distribution", run_single)]
    results: Dict[str, List[Dict[str, Any]]] = {name: [] for name, _ in systems}
    for r in range(args.repeats):
        for name, fn in systems if r % 2 == 0 else systems[::-1]:
            res = fn(args)
            results[name].append(res)
            print(
                f"round {r + 1}: {name}: {res['samples_per_s']:.0f} samples/s "
                f"(final loss {res['final_loss']:.4f})",
                file=sys.stderr,
                flush=True,
            )
    medians = {
        name: statistics.median(x["samples_per_s"] for x in rs) for name, rs in results.items()
    }
    mwms = medians["TF MWMS"]
    print(
        f"\nKeras digits MLP {args.hidden}, {args.workers} workers x batch {args.batch_size} "
        f"(global {args.batch_size * args.workers}), {args.epochs} epochs, "
        f"{args.repeats} rounds, {os.cpu_count()} CPU cores\n"
    )
    print("| system | processes | global batch | samples/s (median) | all runs | vs MWMS |")
    print("|---|---|---|---|---|---|")
    for name, rs in results.items():
        runs = ", ".join(f"{x['samples_per_s']:.0f}" for x in rs)
        print(
            f"| {name} | {rs[0]['processes']} | {rs[0]['global_batch']} | "
            f"{medians[name]:.0f} | {runs} | {medians[name] / mwms:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--role",
        choices=["driver", "fastps", "mwms", "single"],
        default="driver",
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 64])
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow intra/inter-op threads per process (0: TF default)",
    )
    parser.add_argument("--num-groups", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-grouped",
        dest="grouped",
        action="store_false",
        help="skip the fastps run with DistributedOptimizer(num_groups=1)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    if args.role == "driver":
        driver(args)
    else:
        worker(args)


if __name__ == "__main__":
    main()
