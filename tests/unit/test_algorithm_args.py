"""The plugins' shared algorithm checks (``fastps.worker.algorithm_args``): every refusal
names its culprit in the words each plugin's tests expect (OneBitAdam's settings, LocalSGD's
H, outer settings and delta compressor, the algorithm a wrapper runs, server rules). Starts
nothing and imports no framework."""

from __future__ import annotations

import re
from typing import Any, List, Tuple

import pytest
from fastps.errors import FastPSError
from fastps.worker import algorithm_args as A
from fastps.worker.compression import Compression, CoreCompressor

RATES = [("lr", 1e-3, ">= 0"), ("eps", 1e-8, "> 0"), ("weight_decay", 0.0, ">= 0")]


def _rates(**changed: Any) -> List[Tuple[str, Any, str]]:
    return [(name, changed.get(name, value), bound) for name, value, bound in RATES]


def _adam(**kwargs: Any) -> A.OneBitAdamArgs:
    rates = _rates(**kwargs.pop("rates", {}))
    args = dict(betas=(0.9, 0.999), freeze_step=100, compression=None)
    args.update(kwargs)
    return A.onebit_adam_args(rates, **args)


# ---------------------------------------------------------------- OneBitAdam


@pytest.mark.parametrize(
    "rates, exc, message",
    [
        ({"lr": "x"}, TypeError, "OneBitAdam: lr must be a number, got 'x'"),
        ({"lr": True}, TypeError, "OneBitAdam: lr must be a number, got True"),
        ({"lr": float("nan")}, ValueError, "OneBitAdam: lr must be finite, got nan"),
        ({"lr": -1}, ValueError, "OneBitAdam: lr must be >= 0, got -1.0"),
        ({"eps": 0.0}, ValueError, "OneBitAdam: eps must be > 0, got 0.0"),
        ({"eps": float("inf")}, ValueError, "OneBitAdam: eps must be finite, got inf"),
        ({"weight_decay": -0.1}, ValueError, "OneBitAdam: weight_decay must be >= 0, got -0.1"),
        # every value is a number before any bound is checked: eps's type comes first
        ({"lr": -1, "eps": "x"}, TypeError, "OneBitAdam: eps must be a number, got 'x'"),
    ],
)
def test_adam_rates_name_the_setting(rates: Any, exc: type, message: str) -> None:
    with pytest.raises(exc, match=f"^{re.escape(message)}$"):
        _adam(rates=rates)


def test_adam_rates_keep_the_callers_names_and_order() -> None:
    assert A.adam_rates(("learning_rate", 2, ">= 0"), ("epsilon", 1e-7, "> 0")) == [2.0, 1e-7]
    with pytest.raises(ValueError, match=r"^OneBitAdam: wd must be >= 0, got -1\.0$"):
        A.adam_rates(("wd", -1, ">= 0"))
    assert A.adam_rates(("lr", 0, ">= 0")) == [0.0]  # 0 is allowed where the bound is >= 0


@pytest.mark.parametrize(
    "betas, names, exc, message",
    [
        ((0.9,), None, ValueError, "OneBitAdam: betas must be a pair, got (0.9,)"),
        ("ab", None, ValueError, "OneBitAdam: betas must be a pair, got 'ab'"),
        ((1.0, 0.9), None, ValueError, "OneBitAdam: betas[0] must be in [0, 1), got 1.0"),
        ([0.5, -0.1], None, ValueError, "OneBitAdam: betas[1] must be in [0, 1), got -0.1"),
        ((0.5, "q"), None, TypeError, "OneBitAdam: betas[1] must be a number, got 'q'"),
        (
            (0.9, 1.0),
            ("beta1", "beta2"),
            ValueError,
            "OneBitAdam: beta2 must be in [0, 1), got 1.0",
        ),
        ((float("nan"), 0.5), ("beta1", "beta2"), ValueError, "OneBitAdam: beta1 must be finite"),
    ],
)
def test_betas_name_the_culprit(betas: Any, names: Any, exc: type, message: str) -> None:
    with pytest.raises(exc, match=f"^{re.escape(message)}"):
        A.adam_betas(betas, names) if names else A.adam_betas(betas)


@pytest.mark.parametrize(
    "freeze_step, exc, message",
    [
        (2.5, TypeError, "OneBitAdam: freeze_step must be an int, got 2.5"),
        (True, TypeError, "OneBitAdam: freeze_step must be an int, got True"),
        (0, ValueError, "OneBitAdam: freeze_step (the warm-up) must be >= 1, got 0: the"),
        (-1, ValueError, "OneBitAdam: freeze_step (the warm-up) must be >= 1, got -1"),
    ],
)
def test_freeze_step_is_a_positive_int(freeze_step: Any, exc: type, message: str) -> None:
    with pytest.raises(exc, match=f"^{re.escape(message)}"):
        _adam(freeze_step=freeze_step)


def test_compression_defaults_to_onebit_with_error_feedback() -> None:
    args = _adam(betas=[0.5, 0.25])
    assert args.rates == [1e-3, 1e-8, 0.0]
    assert args.betas == (0.5, 0.25) and args.freeze_step == 100
    assert isinstance(args.compression, CoreCompressor) and args.compression.spec == "onebit:ef"
    assert _adam(compression=Compression.fp16).compression is Compression.fp16


def test_compression_must_be_the_cores() -> None:
    message = "OneBitAdam: compression must be one of the core's compressors"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}.*got 'onebit:ef'$"):
        _adam(compression="onebit:ef")  # a spec string only where the plugin takes one
    with pytest.raises(ValueError, match=re.escape(message)):
        _adam(compression=object())
    assert _adam(compression="onebit:ef", spec=True).compression.spec == "onebit:ef"


def test_settings_are_checked_in_one_order() -> None:
    # rates, then betas, then freeze_step, then compression: the first bad one is named
    with pytest.raises(ValueError, match="weight_decay"):
        _adam(rates={"weight_decay": -1}, betas=(2, 2), freeze_step=0, compression="x")
    with pytest.raises(ValueError, match="betas must be a pair"):
        _adam(betas=(1,), freeze_step=0, compression="x")
    with pytest.raises(ValueError, match="freeze_step"):
        _adam(freeze_step=0, compression="x")


# ---------------------------------------------------------------- LocalSGD


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3", None])
def test_local_steps_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match=rf"^DiLoCo: H .* got {re.escape(repr(bad))}$"):
        A.local_sgd_config("DiLoCo", bad, 0.7, 0.9, True)


def test_outer_settings_are_the_servers_and_name_the_class() -> None:
    config = A.local_sgd_config("LocalSGD", 4, 1, 0, False)
    assert (config.lr, config.momentum, config.nesterov) == (1.0, 0.0, False)
    assert isinstance(config.lr, float)
    with pytest.raises(ValueError, match=r"^DiLoCo: outer momentum 1 is not in \[0, 1\)"):
        A.local_sgd_config("DiLoCo", 8, 0.7, 1.0, True)
    with pytest.raises(ValueError, match="^LocalSGD: outer learning rate 0 "):
        A.local_sgd_config("LocalSGD", 8, 0.0, 0.0, False)
    with pytest.raises(TypeError, match="^DiLoCo: nesterov must be True or False, got 1$"):
        A.local_sgd_config("DiLoCo", 8, 0.7, 0.9, 1)
    with pytest.raises(TypeError, match="^LocalSGD: outer_lr must be a number, got 'a'$"):
        A.local_sgd_config("LocalSGD", 8, "a", 0.0, False)


def test_local_sgd_repr_shows_compression_only_when_set() -> None:
    config = A.local_sgd_config("DiLoCo", 8, 0.7, 0.9, True)
    assert A.local_sgd_repr("DiLoCo", 8, config, None) == (
        "DiLoCo(H=8, outer_lr=0.7, momentum=0.9, nesterov=True)"
    )
    assert A.local_sgd_repr("DiLoCo", 8, config, Compression.fp16).endswith(
        "nesterov=True, compression=Compression(fp16))"
    )


def test_delta_compression_refusals_name_the_class() -> None:
    horovod_fp16 = object()  # a plugin's Compression.fp16
    onebit = Compression.onebit(error_feedback=True)
    take = A.delta_compression
    assert take("LocalSGD", horovod_fp16, None, False, horovod_fp16) is Compression.fp16
    assert take("LocalSGD", onebit, onebit, False, horovod_fp16) is onebit
    with pytest.raises(FastPSError, match="^DiLoCo: compression is chosen before the Distrib"):
        take("DiLoCo", onebit, None, True, horovod_fp16)
    with pytest.raises(ValueError, match="^DiLoCo: compression must be one of the core's"):
        take("DiLoCo", "fp16", None, False, horovod_fp16)
    with pytest.raises(ValueError, match="^LocalSGD: compression must be one of the core's"):
        take("LocalSGD", None, None, False, horovod_fp16)
    with pytest.raises(ValueError, match=r"^DiLoCo: compression=Compression\(fp16\) and the "):
        take("DiLoCo", horovod_fp16, onebit, False, horovod_fp16)


# ---------------------------------------------------------------- algorithm choice


class _Base:
    pass


class _Chooser:
    def __init__(self, choice: Any) -> None:
        self.choice = choice

    def fastps_algorithm(self) -> Any:
        return self.choice


def test_chosen_algorithm_takes_the_optimizers_choice_or_none() -> None:
    mine = _Base()
    choose = A.chosen_algorithm
    assert choose(None, object(), _Base, "W", "k") is None  # the wrapper's own averaging
    assert choose(None, _Chooser(mine), _Base, "W", "k") is mine
    assert choose(mine, _Chooser(_Base()), _Base, "W", "k") is mine  # the argument wins
    message = "^DistributedTrainer: algorithm must be a fastps.mxnet.algorithms.Algorithm, got"
    with pytest.raises(TypeError, match=f"{message} str$"):
        choose("onebit", None, _Base, "DistributedTrainer", "fastps.mxnet.algorithms.Algorithm")
    with pytest.raises(TypeError, match=f"{message} NoneType$"):
        choose(
            None, _Chooser(None), _Base, "DistributedTrainer", "fastps.mxnet.algorithms.Algorithm"
        )


# ---------------------------------------------------------------- server rules


def test_server_rules_are_registered_per_registry_and_checked() -> None:
    rules, other = A.ServerRules(), A.ServerRules()
    rules.check(A.SUM, "Algo")
    with pytest.raises(ValueError, match=r"^server rule 'sum' takes no options, got \{'a': 1\}$"):
        rules.check(A.ServerRule("sum", {"a": 1}), "Algo")
    with pytest.raises(TypeError, match="^algorithm Algo: server_rule.. must return a Server"):
        rules.check("sum", "Algo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^a server rule kind is a non-empty string, got ''$"):
        rules.register("", A.check_outer_rule)
    rules.register("outer", A.check_outer_rule)
    rules.check(A.ServerRule("outer", {"lr": 0.7, "momentum": 0.9, "nesterov": True}), "Algo")
    unknown = r"^algorithm Algo: server rule 'outer' is not available \(known: sum\)$"
    with pytest.raises(ValueError, match=unknown):
        other.check(A.ServerRule("outer"), "Algo")  # registered with the other registry only


@pytest.mark.parametrize(
    "options, exc, message",
    [
        ({"lr": 0.7}, ValueError, "server rule 'outer' takes options ['lr', 'momentum', "),
        (
            {"lr": 0.7, "momentum": 2.0, "nesterov": True},
            ValueError,
            "server rule 'outer': outer momentum 2 is not in [0, 1)",
        ),
        (
            {"lr": 0.7, "momentum": 0.9, "nesterov": 1},
            TypeError,
            "server rule 'outer': nesterov must be True or False, got 1",
        ),
    ],
)
def test_outer_rule_refusals_name_the_option(options: Any, exc: type, message: str) -> None:
    with pytest.raises(exc, match=f"^{re.escape(message)}"):
        A.check_outer_rule(A.ServerRule("outer", options))
