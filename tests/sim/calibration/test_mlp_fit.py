"""The MLP trainer's analytic gradient against central finite differences, its loss by hand, and
the decoupled weight decay of its Adam step."""

from __future__ import annotations

import numpy as np
import pytest

from sim.calibration.mlp_fit import _adam_step, _loss_and_grad

EPS = 1e-6
"""Central-difference step: truncation ~EPS^2, rounding ~1e-16 / EPS, both far below the bound."""


def _network(seed: int, features: int = 3, hidden: int = 4, rows: int = 11
             ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal((features, hidden)), rng.standard_normal(hidden) * 0.3,
              rng.standard_normal((hidden, hidden)) * 0.7, rng.standard_normal(hidden) * 0.3,
              rng.standard_normal((hidden, 1)), rng.standard_normal(1) * 0.3]
    x = rng.standard_normal((rows, features))
    y = rng.standard_normal(rows)
    w = rng.uniform(0.2, 3.0, rows)
    return params, x, y, w


def _residuals(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """net(x) - y, from a forward pass written out here (SiLU layers, linear output)."""
    def silu(z: np.ndarray) -> np.ndarray:
        out: np.ndarray = z / (1.0 + np.exp(-z))
        return out
    a2 = silu(silu(x @ params[0] + params[1]) @ params[2] + params[3])
    out: np.ndarray = (a2 @ params[4])[:, 0] + params[5][0] - y
    return out


def _delta_with_both_regimes(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """A Huber delta just below the middle |residual|: rows on both sides, none near the kink."""
    residuals = np.sort(np.abs(_residuals(params, x, y)))
    mid = len(residuals) // 2
    delta = float(0.5 * (residuals[mid - 1] + residuals[mid]))
    assert residuals[mid] - residuals[mid - 1] > 1e-3  # a step of EPS in a parameter crosses no kink
    return delta


@pytest.mark.parametrize("seed", range(6))
def test_gradient_matches_central_differences(seed: int) -> None:
    params, x, y, w = _network(seed)
    delta = _delta_with_both_regimes(params, x, y)
    _, grads = _loss_and_grad(params, x, y, w, delta)
    assert [g.shape for g in grads] == [q.shape for q in params]
    for j, q in enumerate(params):
        numeric = np.zeros_like(q)
        for i in np.ndindex(q.shape):
            saved = q[i]
            q[i] = saved + EPS
            up, _ = _loss_and_grad(params, x, y, w, delta)
            q[i] = saved - EPS
            down, _ = _loss_and_grad(params, x, y, w, delta)
            q[i] = saved
            numeric[i] = (up - down) / (2 * EPS)
        error = float(np.linalg.norm(grads[j] - numeric)) / max(float(np.linalg.norm(numeric)), 1e-12)
        assert error < 1e-6, (seed, j, error)
        assert np.linalg.norm(numeric) > 1e-6, (seed, j)  # a zero gradient would check nothing


def test_loss_of_a_constant_network_by_hand() -> None:
    params, x, _, _ = _network(0, rows=3)
    params[4][:] = 0.0
    params[5][:] = 1.0  # the net predicts 1 everywhere
    y = np.array([1.05, 0.5, 1.0 + 0.2])
    w = np.array([2.0, 1.0, 1.0])
    delta = 0.1
    # r = (-0.05, 0.5, -0.2): quadratic 0.05^2 / 2, then linear 0.1 (0.5 - 0.05) and 0.1 (0.2 - 0.05).
    expected = (2.0 * 0.00125 + 0.045 + 0.015) / (delta * 3)
    loss, grads = _loss_and_grad(params, x, y, w, delta)
    assert loss == pytest.approx(expected, rel=1e-12)
    # d loss / d b3: w huber'(r) / (delta n) = (2 (-0.05) / 0.1 + 1 - 1) / 3
    assert grads[5][0] == pytest.approx((2.0 * -0.5 + 1.0 - 1.0) / 3, rel=1e-12)


def test_adam_step_decays_matrices_only() -> None:
    """With zero gradients the Adam moments stay zero, so only the decoupled decay moves a parameter."""
    params, _, _, _ = _network(1)
    before = [q.copy() for q in params]
    zeros = [np.zeros_like(q) for q in params]
    _adam_step(params, zeros, [z.copy() for z in zeros], [z.copy() for z in zeros], step=1, lr=0.5,
               weight_decay=0.1)
    for j, (new, old) in enumerate(zip(params, before, strict=True)):
        factor = 1.0 - 0.5 * 0.1 if j % 2 == 0 else 1.0  # W1, W2, W3 decay; biases do not
        np.testing.assert_allclose(new, old * factor, rtol=1e-15, atol=0.0)
