"""fastps jobs on a Ray cluster: the scheduler, the summation servers and the workers run as
Ray actors (``fastps.ray.RayExecutor``, Horovod's ``RayExecutor`` API). Ray Train's
``TorchTrainer`` needs nothing from here: it forms the job through the ``fastps``
torch.distributed backend (``fastps.launch.store_rendezvous``)."""
