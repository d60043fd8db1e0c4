"""The framework-free part of the plugins' training algorithms (``fastps.<plugin>.algorithms``).

Kept in one place so that every plugin refuses the same settings with the same words: the
checks of ``OneBitAdam``'s and ``LocalSGD``'s arguments, the choice of the algorithm a
wrapper runs, and the server rules an algorithm declares (:class:`ServerRule`, with a
registry of the kinds a plugin accepts). Nothing here knows a framework: a plugin passes
its own names (MXNet's ``learning_rate`` for torch's ``lr``, its Horovod-style ``fp16``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Sequence, Tuple

from fastps.errors import FastPSError
from fastps.worker import outer_mode as _outer
from fastps.worker.compression import Compression, is_core

__all__ = [
    "SUM",
    "OneBitAdamArgs",
    "ServerRule",
    "ServerRules",
    "adam_betas",
    "adam_pair",
    "adam_rates",
    "check_outer_rule",
    "chosen_algorithm",
    "delta_compression",
    "is_core",
    "local_sgd_config",
    "local_sgd_repr",
    "onebit_adam_args",
]

# The prefix of every OneBitAdam refusal, whichever plugin's optimizer refuses.
_ADAM = "OneBitAdam"


# ---------------------------------------------------------------- algorithm choice


def chosen_algorithm(algorithm: Any, optimizer: Any, base: type, wrapper: str, kind: str) -> Any:
    """The algorithm a wrapper (``wrapper``: its name in messages) runs, or None for its
    own averaging path: ``algorithm=None`` takes the optimizer's choice (an optimizer that
    needs one, like ``OneBitAdam``, names it with a ``fastps_algorithm()`` method). Refuses
    anything but an instance of the plugin's ``base`` class (``kind``: its public name)."""
    if algorithm is None:
        chooser = getattr(optimizer, "fastps_algorithm", None)
        if chooser is None:
            return None
        algorithm = chooser()
    if not isinstance(algorithm, base):
        raise TypeError(f"{wrapper}: algorithm must be a {kind}, got {type(algorithm).__name__}")
    return algorithm


# ---------------------------------------------------------------- server rules


@dataclass(frozen=True)
class ServerRule:
    """What the summation servers do with an algorithm's pushes.

    ``kind``: ``"sum"`` (the core's rule: the servers sum every worker's push, decoding and
    re-encoding compressed ones) or a kind registered with a plugin's
    ``register_server_rule``. ``options``: the rule's settings (e.g. an outer learning
    rate), checked by the registered checker."""

    kind: str = "sum"
    options: Mapping[str, Any] = field(default_factory=dict)


SUM = ServerRule("sum")


def _check_sum(rule: ServerRule) -> None:
    if rule.options:
        raise ValueError(f"server rule 'sum' takes no options, got {dict(rule.options)}")


def check_outer_rule(rule: ServerRule) -> None:
    """The checker of ``"outer"`` (local SGD's outer optimizer on the servers): the servers'
    own check of its settings, so both ends refuse with the same words."""
    opts = dict(rule.options)
    known = {"lr", "momentum", "nesterov"}
    if set(opts) != known:
        raise ValueError(f"server rule 'outer' takes options {sorted(known)}, got {sorted(opts)}")
    _outer.check_outer_config(opts["lr"], opts["momentum"], opts["nesterov"], "server rule 'outer'")


class ServerRules:
    """The server rules one plugin's wrapper accepts: kind -> checker(rule), which raises
    when the rule's options are not valid or the core cannot carry it out. One per plugin,
    so what a program registers for one framework leaves the others as they were."""

    def __init__(self) -> None:
        self.checks: Dict[str, Callable[[ServerRule], None]] = {"sum": _check_sum}

    def register(self, kind: str, check: Callable[[ServerRule], None]) -> None:
        """Makes ``kind`` a rule this registry accepts, checked by ``check(rule)``."""
        if not kind or not isinstance(kind, str):
            raise ValueError(f"a server rule kind is a non-empty string, got {kind!r}")
        self.checks[kind] = check

    def check(self, rule: ServerRule, algorithm: str) -> None:
        """Raises unless ``rule`` is registered and its checker accepts it."""
        if not isinstance(rule, ServerRule):
            raise TypeError(
                f"algorithm {algorithm}: server_rule() must return a ServerRule, got "
                f"{type(rule).__name__}"
            )
        check = self.checks.get(rule.kind)
        if check is None:
            raise ValueError(
                f"algorithm {algorithm}: server rule '{rule.kind}' is not available (known: "
                f"{', '.join(sorted(self.checks))})"
            )
        check(rule)


# ---------------------------------------------------------------- OneBitAdam


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{_ADAM}: {name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{_ADAM}: {name} must be finite, got {value!r}")
    return float(value)


def adam_rates(*settings: Tuple[str, Any, str]) -> List[float]:
    """Each setting ``(name, value, bound)`` as a float: first every value must be a finite
    number, then each must meet its bound, ``">= 0"`` or ``"> 0"`` (eps: the frozen variance
    is zero where a coordinate never had a gradient), in the order given; the refusal names
    the setting as the caller spelled it."""
    values = [_number(name, value) for name, value, _ in settings]
    for (name, _, bound), v in zip(settings, values):
        if (v <= 0) if bound == "> 0" else (v < 0):
            raise ValueError(f"{_ADAM}: {name} must be {bound}, got {v}")
    return values


def adam_pair(betas: Any) -> Tuple[Any, Any]:
    """``betas`` as two values, refused unless a tuple or list of two."""
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"{_ADAM}: betas must be a pair, got {betas!r}")
    return betas[0], betas[1]


def adam_betas(
    betas: Any, names: Tuple[str, str] = ("betas[0]", "betas[1]")
) -> Tuple[float, float]:
    """Adam's two decay rates, each a number in [0, 1) (``names``: as the caller's
    arguments are called, ``beta1``/``beta2`` in MXNet)."""
    b1, b2 = (_number(n, v) for n, v in zip(names, adam_pair(betas)))
    for n, b in zip(names, (b1, b2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{_ADAM}: {n} must be in [0, 1), got {b}")
    return b1, b2


class OneBitAdamArgs(NamedTuple):
    """A OneBitAdam's settings once checked (``rates`` in the order :func:`adam_rates` was
    given them)."""

    rates: List[float]
    betas: Tuple[float, float]
    freeze_step: int
    compression: Any


def onebit_adam_args(
    rates: Sequence[Tuple[str, Any, str]],
    betas: Any,
    freeze_step: Any,
    compression: Any,
    beta_names: Tuple[str, str] = ("betas[0]", "betas[1]"),
    spec: bool = False,
) -> OneBitAdamArgs:
    """Every plugin's ``OneBitAdam`` settings, checked in one order so that the same bad
    arguments get the same refusal: ``rates`` (:func:`adam_rates`), ``betas``
    (:func:`adam_betas`), ``freeze_step`` (the warm-up: an int >= 1) and ``compression``
    (how the momentum travels: None for ``onebit`` with error feedback, else a core
    compressor, or with ``spec`` its spec string such as ``"onebit:ef"``)."""
    values = adam_rates(*rates)
    b1, b2 = adam_betas(betas, beta_names)
    if isinstance(freeze_step, bool) or not isinstance(freeze_step, int):
        raise TypeError(f"{_ADAM}: freeze_step must be an int, got {freeze_step!r}")
    if freeze_step < 1:
        raise ValueError(
            f"{_ADAM}: freeze_step (the warm-up) must be >= 1, got {freeze_step}: the "
            "variance frozen after it is Adam's, which a warm-up of no steps never computed"
        )
    if spec and isinstance(compression, str):
        compression = Compression.from_spec(compression)
    if compression is None:
        compression = Compression.onebit(error_feedback=True)
    elif not is_core(compression):
        raise ValueError(
            f"{_ADAM}: compression must be one of the core's compressors "
            f"(fastps.Compression...), got {compression!r}"
        )
    return OneBitAdamArgs(values, (b1, b2), freeze_step, compression)


# ---------------------------------------------------------------- LocalSGD / DiLoCo


def local_sgd_config(
    who: str, H: Any, outer_lr: Any, momentum: Any, nesterov: Any
) -> _outer.OuterConfig:
    """Refuses a LocalSGD's (``who``: the class's name) local steps ``H`` unless an int
    >= 1, and outer settings the servers would refuse; the outer optimizer they run."""
    if isinstance(H, bool) or not isinstance(H, int) or H < 1:
        raise ValueError(
            f"{who}: H (local steps per outer step) must be an integer >= 1, got {H!r}"
        )
    _outer.check_outer_config(outer_lr, momentum, nesterov, who)
    return _outer.OuterConfig(float(outer_lr), float(momentum), nesterov)


def overlap_flag(who: str, overlap: Any) -> bool:
    """A LocalSGD's ``overlap`` argument, checked (the same in every plugin)."""
    if not isinstance(overlap, bool):
        raise TypeError(f"{who}: overlap must be True or False, got {overlap!r}")
    return overlap


def overlap_warmup(who: str, warmup: Any) -> int:
    """A LocalSGD's ``overlap_warmup`` (synchronous rounds before overlapping), checked."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(
            f"{who}: overlap_warmup (synchronous rounds before overlapping) must be an "
            f"integer >= 0, got {warmup!r}"
        )
    return warmup


# Defined beside the rounds, which show it too.
local_sgd_repr = _outer.local_sgd_repr


def delta_compression(who: str, compression: Any, current: Any, chosen: bool, fp16: Any) -> Any:
    """The compressor a LocalSGD (``who``) sends its deltas with, given ``compression`` by
    the wrapper or its own argument while it holds ``current`` (None: none yet). Refused
    once its exchange is set up (``chosen``), unless a core compressor (``fp16``: the
    plugin's Horovod-style fp16, taken as the core's), or when it names a second one."""
    if chosen:
        raise FastPSError(f"{who}: compression is chosen before the DistributedOptimizer")
    if compression is fp16:
        compression = Compression.fp16
    if not is_core(compression):
        raise ValueError(
            f"{who}: compression must be one of the core's compressors "
            f"(fastps.Compression...), got {compression!r}"
        )
    if current is not None and current != compression:
        raise ValueError(
            f"{who}: compression={compression!r} and the algorithm's own "
            f"compression={current!r} name two compressors; give one"
        )
    return compression
