"""The session of ``fastps.mxnet``: ``init`` / ``shutdown`` and who this worker is, built
on the plugins' shared basics (``fastps.collectives.basics``). Its own module so that the
plugin's other modules (the trainer's cross-barrier choice) can ask without importing the
package that imports them."""

from __future__ import annotations

from fastps.collectives.basics import Basics

# rank() and size() ask the core (FastPSError before fastps.init()). Cross-barrier updates
# are off unless asked for (DistributedTrainer's docstring: they need MXNet's
# MXEnginePushSyncND and report a wait's error only at the next step).
basics = Basics("mxnet", cross_barrier_default=False)

init = basics.init
shutdown = basics.shutdown
is_initialized = basics.is_initialized
rank = basics.rank
size = basics.size
local_rank = basics.local_rank
local_size = basics.local_size
cross_rank = basics.cross_rank
cross_size = basics.cross_size
is_homogeneous = basics.is_homogeneous
num_servers = basics.num_servers
