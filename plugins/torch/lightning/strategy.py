"""``FastPSStrategy``: ``Trainer(strategy="fastps")``, Lightning training on fastps's
``DistributedOptimizer`` (the successor of Lightning's removed ``HorovodStrategy``).

* Gradients: each optimizer Lightning builds from ``configure_optimizers`` is wrapped in
  ``fastps.torch.DistributedOptimizer``, so every gradient starts its push_pull the moment
  backward produced it, in priority order (the layer the next forward pass needs first goes
  first), and ``step()`` returns without waiting: each parameter is updated when its sum
  arrives (cross-barrier updates; ``cross_barrier=False`` turns them off). The model is not
  wrapped in DDP.
* Everything else Lightning does across ranks (``self.log(..., sync_dist=True)``, barriers,
  broadcasts, all_gather, torchmetrics) runs on the default torch.distributed process group,
  created with the ``fastps`` backend: one fastps job serves both.
* Processes: Lightning starts them itself (``devices=N``), or torchrun, SLURM (``srun``) or
  ``fastpsrun`` did (``FastPSEnvironment``).
* When something reads the gradients between backward and the step (gradient clipping, an
  ``on_before_optimizer_step`` hook, manual optimization), the strategy waits for the sums
  right after backward and that step is synchronous.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Dict, List, Optional, Union

import torch
import torch.distributed as dist
from fastps.config import Config
from fastps.errors import FastPSError
from fastps.torch import basics
from fastps.torch.functions import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from fastps.torch.lightning.closure_first import closure_first, mark_synchronized
from fastps.torch.lightning.environment import FastPSEnvironment
from fastps.torch.optimizer import DistributedOptimizer
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning_utilities.core.overrides import is_overridden

__all__ = ["FastPSStrategy"]

BACKEND = "fastps"
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch's own default

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # summed, then divided
    "avg": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def _reduce_op(reduce_op: Any) -> tuple[Any, bool]:
    """(torch's op, whether to divide by the world size) for Lightning's ``reduce_op``."""
    if reduce_op is None:
        return dist.ReduceOp.SUM, True
    if isinstance(reduce_op, str):
        key = reduce_op.lower()
        if key not in _REDUCE_OPS:
            raise ValueError(
                f"FastPSStrategy.reduce: reduce_op={reduce_op!r} is not one of "
                f"{sorted(_REDUCE_OPS)} (or a torch.distributed.ReduceOp)"
            )
        return _REDUCE_OPS[key], key in ("mean", "avg")
    if reduce_op == dist.ReduceOp.AVG:
        return dist.ReduceOp.SUM, True
    return reduce_op, False


class FastPSStrategy(ParallelStrategy):
    """Data-parallel training on fastps. ``compression``, ``backward_passes_per_step``
    (default: the Trainer's ``accumulate_grad_batches``) and ``cross_barrier`` are
    ``fastps.torch.DistributedOptimizer``'s; ``timeout`` bounds every wait between ranks
    (default: torch's 30 minutes)."""

    strategy_name = BACKEND

    def __init__(
        self,
        accelerator: Any = None,
        parallel_devices: Optional[List[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        compression: Any = None,
        backward_passes_per_step: Optional[int] = None,
        cross_barrier: Optional[bool] = None,
        timeout: Optional[datetime.timedelta] = None,
    ) -> None:
        if cluster_environment is None and FastPSEnvironment.detect():
            cluster_environment = FastPSEnvironment()
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        if backward_passes_per_step is not None and backward_passes_per_step < 1:
            raise ValueError(
                "FastPSStrategy: backward_passes_per_step must be >= 1, got "
                f"{backward_passes_per_step}"
            )
        self._num_nodes = 1
        self._compression = compression
        self._passes = backward_passes_per_step
        self._cross_barrier = cross_barrier
        self._timeout = timeout if timeout is not None else DEFAULT_TIMEOUT
        self._reads_gradients = False

    # -- where this process is --------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices or [torch.device("cpu")]
        if self.local_rank < len(devices):
            return devices[self.local_rank]
        if all(d.type == "cpu" for d in devices):
            return torch.device("cpu")  # more ranks on this host than devices= said (fastpsrun)
        raise FastPSError(
            f"FastPSStrategy: local rank {self.local_rank} has no device among {devices}"
        )

    @property
    def is_distributed(self) -> bool:
        """Lightning asks this of strategies it does not know: True makes
        ``self.log(..., sync_dist=True)`` reduce across the ranks."""
        return True

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes
            )

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(
                self.node_rank * self.num_processes + self.local_rank
            )
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        from lightning.fabric.utilities.rank_zero import rank_zero_only

        rank_zero_only.rank = self.global_rank

    # -- the job ----------------------------------------------------------------------

    def setup_environment(self) -> None:
        self.set_world_ranks()
        self._init_process_group()
        super().setup_environment()

    def _init_process_group(self) -> None:
        env = self.cluster_environment
        assert env is not None
        if dist.is_initialized():
            backend = dist.get_backend()
            if backend != BACKEND:
                raise FastPSError(
                    f"FastPSStrategy: the default process group exists already with backend "
                    f"{backend!r}; create it with init_process_group('fastps'), or let the "
                    "strategy create it"
                )
        elif isinstance(env, FastPSEnvironment):
            basics.init()  # joins fastpsrun's job
            dist.init_process_group(
                BACKEND,
                store=_job_store(self._timeout),
                rank=basics.rank(),
                world_size=basics.size(),
                timeout=self._timeout,
            )
        else:
            os.environ["MASTER_ADDR"] = env.main_address
            os.environ["MASTER_PORT"] = str(env.main_port)
            dist.init_process_group(
                BACKEND,
                rank=env.global_rank(),
                world_size=env.world_size(),
                timeout=self._timeout,
            )
        if not basics.is_initialized():
            basics.init()  # the process group's creator joined the job; this is a no-op then
        if basics.rank() != self.global_rank or basics.size() != self.world_size:
            raise FastPSError(
                f"FastPSStrategy: Lightning's rank {self.global_rank} of {self.world_size} is "
                f"fastps's rank {basics.rank()} of {basics.size()}: the launcher and the cluster "
                f"environment ({type(env).__name__}) disagree"
            )

    def setup(self, trainer: Trainer) -> None:
        super().setup(trainer)  # the model on its device, optimizers, precision
        assert self.lightning_module is not None
        # every rank starts from rank 0's weights (as DDP's first broadcast does)
        broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)
        if trainer.state.fn == TrainerFn.FITTING:
            self._reads_gradients = _reads_gradients(trainer, self.lightning_module)
            if self._reads_gradients and trainer.accumulate_grad_batches > 1:
                raise FastPSError(
                    "FastPSStrategy: gradient clipping, on_before_optimizer_step hooks or "
                    "manual optimization together with accumulate_grad_batches > 1 are not "
                    "supported: drop one of them"
                )
            base: Any = self  # Lightning's optimizers property (untyped here)
            base.optimizers = self._distributed(trainer, list(base.optimizers))

    def _distributed(self, trainer: Trainer, optimizers: List[Any]) -> List[Any]:
        """Each optimizer wrapped in fastps's DistributedOptimizer, its state rank 0's."""
        module = self.lightning_module
        names = {id(p): n for n, p in module.named_parameters()}
        passes = self._passes or int(trainer.accumulate_grad_batches)
        wrapped = []
        for opt in optimizers:
            named = [
                (names.get(id(p), f"param.{i}.{j}"), p)
                for i, group in enumerate(opt.param_groups)
                for j, p in enumerate(group["params"])
            ]
            kwargs: Dict[str, Any] = {
                "named_parameters": named,
                "backward_passes_per_step": passes,
                "cross_barrier": self._cross_barrier,
            }
            if self._compression is not None:
                kwargs["compression"] = self._compression
            dopt = DistributedOptimizer(opt, **kwargs)
            broadcast_optimizer_state(dopt, root_rank=0)
            wrapped.append(closure_first(dopt))
        return wrapped

    # -- training ---------------------------------------------------------------------

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """The sums are awaited here only if something reads the gradients before the
        step; otherwise they arrive while the step and the next forward pass run."""
        if not self._reads_gradients:
            return
        for opt in self._fastps_optimizers():
            opt.synchronize()
            mark_synchronized(opt)

    def _fastps_optimizers(self) -> List[Any]:
        base: Any = self
        return [o for o in base.optimizers if hasattr(o, "wait_for_updates")]

    def _apply_pending(self) -> None:
        """Applies every update a cross-barrier step deferred, so that the parameters can be
        read directly (checkpoints, the model after fit)."""
        for opt in self._fastps_optimizers():
            opt.wait_for_updates()

    def lightning_module_state_dict(self) -> Dict[str, Any]:
        self._apply_pending()
        return super().lightning_module_state_dict()

    def on_validation_start(self) -> None:
        self._apply_pending()

    def on_test_start(self) -> None:
        self._apply_pending()

    def on_predict_start(self) -> None:
        self._apply_pending()

    def on_train_end(self) -> None:
        self._apply_pending()

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # -- collectives Lightning asks for ---------------------------------------------

    def barrier(self, name: Optional[str] = None) -> None:
        if dist.is_initialized():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]

    def reduce(
        self,
        tensor: Union[torch.Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[Any, str]] = "mean",
    ) -> Union[torch.Tensor, Any]:
        """``tensor`` reduced over the ranks (a new tensor; other values come back as
        they are). ``reduce_op``: "mean" (default), "sum", "max", "min" or a ReduceOp."""
        if not isinstance(tensor, torch.Tensor) or not dist.is_initialized():
            return tensor
        op, mean = _reduce_op(reduce_op)
        out = tensor.detach().clone()
        if mean and not out.is_floating_point():
            out = out.float()
        dist.all_reduce(out, op=op, group=group)
        if mean:
            out = out / dist.get_world_size(group)
        return out

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            BACKEND,
            cls,
            description="data-parallel training on fastps (DistributedOptimizer, cross-barrier)",
        )


def _reads_gradients(trainer: Trainer, module: LightningModule) -> bool:
    """Whether anything looks at the gradients between backward and the step."""
    if trainer.gradient_clip_val or not module.automatic_optimization:
        return True
    for hook in ("on_before_optimizer_step", "configure_gradient_clipping"):
        if is_overridden(hook, module, LightningModule):
            return True
    return any(is_overridden("on_before_optimizer_step", cb, Callback) for cb in trainer.callbacks)


def _job_store(timeout: datetime.timedelta) -> Any:
    """A TCPStore for torch.distributed in a fastpsrun job (no MASTER_ADDR there): rank 0
    listens on a free port and tells the others through fastps."""
    if basics.rank() == 0:
        store = dist.TCPStore(
            "0.0.0.0", 0, basics.size(), is_master=True, timeout=timeout, wait_for_workers=False
        )
        host = Config.from_env().host or socket.gethostname()
        broadcast_object((host, int(store.port)), root_rank=0)
        return store
    host, port = broadcast_object(None, root_rank=0)
    return dist.TCPStore(host, port, basics.size(), is_master=False, timeout=timeout)
