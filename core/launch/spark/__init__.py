"""fastps jobs on a Spark cluster: ``fastps.spark.run`` (Horovod's ``horovod.spark.run``)
runs a function in one barrier-mode stage, one task per rank. Spark's
``TorchDistributor`` needs nothing from here: ``init_process_group("fastps")`` in its
training function forms the job through the store it sets up."""
