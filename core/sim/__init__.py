"""fastps.sim: a discrete-event simulator of fastps jobs past what one machine can host.

It runs the real placement (fastps.placement), the real partitioner and push scheduler
(fastps._core.partition, fastps._core.PushScheduler) over a fluid model of the network
(links fair-shared or paced, with latency), servers that sum at the measured kernel speed,
and workers that train the built-in models' layers (``fastps.sim.models``, the tables the
GPU-profile emulator trains too). docs/design/simulator.md explains the model, its calibration
against the emulated rack, and its limits.

    from fastps import sim
    w = sim.workload.load("resnet50")
    r = sim.train(sim.Cluster(workers=64, cpu_machines=16, link_mbit=25_000), w)
    print(r.iteration_s, r.bound_s)
"""

from . import models, workload
from .allreduce import train_allreduce
from .cluster import Cluster, layout
from .pushpull import CommOptions
from .training import Result, TrainOptions, communicate, train

__all__ = [
    "Cluster",
    "CommOptions",
    "Result",
    "TrainOptions",
    "communicate",
    "layout",
    "models",
    "train",
    "train_allreduce",
    "workload",
]
