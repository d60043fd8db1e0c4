"""``fastps.spark``: fastps jobs on a Spark cluster, with Horovod's ``horovod.spark.run``.

    from pyspark.sql import SparkSession
    import fastps.spark

    spark = SparkSession.builder.master("local[4]").getOrCreate()
    results = fastps.spark.run(train_fn, args=(epochs,), num_proc=4)  # rank order

``train_fn`` calls ``hvd.init()`` of ``fastps.torch`` (or TensorFlow's). The code lives in
``fastps.launch.spark``; docs/guide/spark.md also shows Spark's ``TorchDistributor`` with
``init_process_group("fastps")``.
"""

from __future__ import annotations

from fastps.launch.spark.run import run

__all__ = ["run"]
