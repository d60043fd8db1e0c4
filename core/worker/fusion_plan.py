"""A gradient reducer's tensor-fusion plan, shared by the plugins (torch's
``DistributedOptimizer``, MXNet's ``DistributedTrainer``).

The core packs the small tensors of a plan into buckets (``csrc/worker/fusion.h``,
``api.set_fusion_plan``). What a plugin must get right around it is the same everywhere and
lives here once:

- **When**: the rows are what one step pushed (name, bytes, dtype, priority), and the plan
  is set once every gradient of that step has started, so every rank sets it after the
  same pushes; it is set again only when the rows change (a parameter frozen, a group
  added), which every rank notices at the same step.
- **Who owns a name**: the core knows a tensor by its name only, so a reducer whose
  gradients carry another reducer's names (a model built again, a GAN's two optimizers
  stepped in turn) first drops the other's plan (:meth:`FusionPlan.claim`), on every rank
  at the same point, instead of meeting that plan's sizes.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Dict, Optional, Sequence, Tuple

from fastps.errors import FastPSError
from fastps.worker import api

Row = Tuple[str, int, str, int]  # (tensor name, bytes, core dtype, priority)

# Tensor name -> the plan that fuses it (the newest plan owns a name, as in the core), as
# a plain dict of weak references: ``claim`` runs once per gradient and step, and a dict
# lookup plus a call of the reference costs a fraction of ``WeakValueDictionary.get``. A
# dead reference (its plan gone) owns nothing.
_owners: Dict[str, weakref.ReferenceType[FusionPlan]] = {}


class FusionPlan:
    """One reducer's plan, named ``name`` in the core (unique per reducer, the same on
    every rank: derive it from a creation-order counter)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: Optional[Tuple[Row, ...]] = None  # the rows last set; None: none set
        self.buckets = 0  # buckets of that plan
        self._ref = weakref.ref(self)

    def update(self, rows: Sequence[Row]) -> int:
        """Sets the plan to ``rows`` unless they are the ones already set (call it once
        every gradient of the step has started); returns the number of buckets. Does
        nothing while fusion is off (FASTPS_FUSION_THRESHOLD=0, or one worker)."""
        if not api.fusion_enabled():
            return 0
        if self.rows is not None and len(rows) == len(self.rows) and tuple(rows) == self.rows:
            return self.buckets  # every step of a training loop: nothing changed
        key = tuple((str(n), int(b), str(d), int(p)) for n, b, d, p in rows)
        if key == self.rows:
            return self.buckets
        self.rows = key
        self.buckets = api.set_fusion_plan(self.name, key)
        for row in key:
            _owners[row[0]] = self._ref
        return self.buckets

    def claim(self, tensor: str) -> None:
        """Before pushing ``tensor``: if another plan fuses a tensor of this name, that
        plan is dropped first (cheap when no plan exists anywhere)."""
        ref = _owners.get(tensor)
        if ref is not None and ref is not self._ref:
            owner = ref()
            if owner is not None:
                owner.drop()
            else:
                del _owners[tensor]  # its plan is gone

    def drop(self) -> None:
        """Removes the plan from the core: its tensors travel alone until it is set again."""
        if self.rows and api.is_initialized():
            with contextlib.suppress(FastPSError):
                api.set_fusion_plan(self.name, [])
        self.forget()

    def forget(self) -> None:
        """Forgets the plan without telling the core (an elastic reset: the new core has
        none), so the next :meth:`update` sets it again."""
        for row in self.rows or ():
            if _owners.get(row[0]) is self._ref:
                del _owners[row[0]]
        self.rows = None
        self.buckets = 0
