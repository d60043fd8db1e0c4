"""The control plane: everything that coordinates a job but moves no gradient.

``protocol`` is the wire format of control messages and the workers' and servers' client;
``scheduler`` the process every role registers with (membership, declarations, barriers,
failure fan-out, the stall inspector's judgement in ``stalls``), ``coordinator`` the
negotiation of collectives, ``server_pool`` the summation servers that join and leave an
elastic job, ``placement`` which server owns which part, ``server`` and ``shared_server``
the summation servers' mains, ``linkspeed`` and ``netif`` the network they run on, and
``elastic_wire`` the messages of elastic rendezvous.

``from fastps import control`` as before: attributes are those of ``protocol``.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    # Read live from protocol on every access (its module state included), never copied.
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("fastps.control.protocol"), name)
