"""``horovod.runner.elastic.worker``: ``HostUpdateResult`` is fastps's."""

from fastps.elastic.notifications import HostUpdateResult

__all__ = ["HostUpdateResult"]
