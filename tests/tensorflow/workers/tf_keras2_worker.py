"""fastps.tensorflow.keras under Keras 2 (``tf_keras``; ``TF_USE_LEGACY_KERAS=1`` makes
``tf.keras`` it): DistributedOptimizer around a current and a legacy Keras 2 optimizer,
and the callbacks, in ``model.fit``.

Each rank starts from its own weights and trains on its own data; after ``fit`` every
rank must hold the same weights (broadcast at the start, averaged gradients after) and
the same, averaged, losses. Prints "rank R OK" at the end.
"""

from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import fastps.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def same_on_every_rank(values: np.ndarray, what: str) -> None:
    gathered = hvd.allgather(tf.constant(values[None], tf.float64)).numpy()
    assert np.allclose(gathered, gathered[0]), (what, gathered)


def main() -> None:
    hvd.init()
    r = hvd.rank()
    assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
    optimizers = {
        "current": lambda: tf.keras.optimizers.SGD(0.1),
        "legacy": lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.5),
    }
    for kind, make in optimizers.items():
        tf.keras.utils.set_random_seed(100 + r)  # different initial weights on every rank
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
        opt = hvd.DistributedOptimizer(make())
        assert isinstance(opt, type(make())), type(opt).__mro__
        model.compile(optimizer=opt, loss="mse")
        x = np.random.RandomState(r).rand(8, 3).astype("float32")
        hist = model.fit(
            x,
            x[:, :2] * (r + 1),
            batch_size=4,
            epochs=3,
            verbose=0,
            callbacks=[
                hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                hvd.callbacks.MetricAverageCallback(),
                hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5, start_epoch=1),
            ],
        )
        weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
        same_on_every_rank(weights, f"{kind}: weights after fit")
        same_on_every_rank(np.array(hist.history["loss"]), f"{kind}: averaged losses")
        assert np.allclose(hist.history["learning_rate"], [0.1, 0.05, 0.05]), hist.history
        print(f"{kind} Keras 2 optimizer: ok", flush=True)
    try:
        hvd.DistributedOptimizer(object())
    except TypeError as exc:
        assert "Keras 2" in str(exc), exc
    else:
        raise AssertionError("a non-optimizer must be refused")
    try:
        hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), **{"async": True})
    except ValueError as exc:
        assert "Keras 2" in str(exc) and "SGD" in str(exc), exc
    else:
        raise AssertionError("async with a Keras 2 optimizer must be refused")
    print(f"rank {r} OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
