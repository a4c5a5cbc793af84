"""The array-wise log normal-CDF gives Optuna's own values bitwise, and TPE with it asks exactly the
trials it asks without it."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.samplers._tpe import _truncnorm

from orchestrator.sweep import fast_truncnorm


def _optuna_log_ndtr(a: np.ndarray) -> np.ndarray:
    """Optuna's definition: its scalar function, element by element."""
    return np.frompyfunc(_truncnorm._log_ndtr_single, 1, 1)(a).astype(float)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).view(np.int64)


def test_every_branch_is_bitwise_optunas() -> None:
    rng = np.random.default_rng(0)
    grid = np.concatenate([
        np.linspace(-30.0, 30.0, 120_001),
        rng.normal(0.0, 8.0, 50_000),
        np.nextafter(np.array([-20.0, 6.0, -0.7071067811865475 * 2**0.5, 0.7071067811865475 * 2**0.5]), np.inf),
        np.nextafter(np.array([-20.0, 6.0, -1.0, 1.0]), -np.inf),
        [-np.inf, np.inf, 0.0, -0.0],
    ])
    fast = fast_truncnorm.log_ndtr
    assert np.array_equal(_bits(fast(grid)), _bits(_optuna_log_ndtr(grid)))
    assert np.isnan(fast(np.array([np.nan]))[0])
    # The left tail's series: its elements stop summing after different numbers of terms.
    tail = np.concatenate([-np.geomspace(20.0, 1e12, 20_000), -20.0 - rng.exponential(5.0, 20_000)])
    assert np.array_equal(_bits(fast_truncnorm.log_ndtr_left_tail(tail)), _bits(_optuna_log_ndtr(tail)))
    # Shapes other than 1-d come back in their shape.
    block = grid[:600].reshape(20, 30)
    assert np.array_equal(_bits(fast(block)), _bits(_optuna_log_ndtr(block)))


def test_ndtr_matches_the_scalar_definition() -> None:
    xs = np.linspace(-12.0, 12.0, 4001)
    want = np.array([_truncnorm._ndtr_single(float(x)) for x in xs])
    assert np.array_equal(_bits(fast_truncnorm.ndtr(xs)), _bits(want))
    assert fast_truncnorm.ndtr(np.array([0.0]))[0] == 0.5 and math.isclose(fast_truncnorm.ndtr(np.array([1.0]))[0],
                                                                          0.8413447460685429)


def _asks(n: int) -> list[dict[str, object]]:
    sampler = optuna.samplers.TPESampler(seed=3, multivariate=True, n_startup_trials=5)
    study = optuna.create_study(sampler=sampler, directions=["minimize", "minimize"])
    asked = []
    for _ in range(n):
        trial = study.ask()
        seqs = trial.suggest_int("max_num_seqs", 8, 256, log=True)
        tokens = trial.suggest_categorical("max_num_batched_tokens", [1024, 2048, 4096])
        asked.append(dict(trial.params))
        study.tell(trial, [seqs * 0.01 + tokens / 4096, 1.0 / seqs])
    return asked


def test_tpe_asks_the_same_trials_with_and_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_truncnorm, "_log_ndtr", _optuna_log_ndtr)
    plain = _asks(40)
    assert fast_truncnorm.install()
    assert getattr(_truncnorm._log_ndtr, "kernelsight_array_wise", False)
    assert fast_truncnorm.install()  # idempotent
    assert _asks(40) == plain


def test_an_optuna_of_another_shape_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def different(a: np.ndarray) -> np.ndarray:
        return np.zeros_like(np.asarray(a, dtype=float))

    monkeypatch.setattr(_truncnorm, "_log_ndtr", different)
    assert not fast_truncnorm.install()
    assert _truncnorm._log_ndtr is different
    monkeypatch.delattr(_truncnorm, "_log_ndtr_single")
    monkeypatch.setattr(_truncnorm, "_log_ndtr", _optuna_log_ndtr)
    assert not fast_truncnorm.install()
