"""The session of ``fastps.torch``: ``init`` / ``shutdown`` and who this worker is (rank,
size, local and cross ranks), built on the plugins' shared basics
(``fastps.collectives.basics``). Its own module so that the plugin's other modules (elastic
training among them) can ask without importing the package that imports them."""

from __future__ import annotations

from fastps.collectives.basics import Basics

# Horovod's torch raises ValueError for rank() and size() outside init() ... shutdown().
# Cross-barrier updates are on by default here (off in Keras and MXNet): every read of a
# parameter whose update is pending can be intercepted (cross_barrier.py).
basics = Basics("torch", uninitialized=ValueError, cross_barrier_default=True)

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
