"""Training the cross-generation MLP in numpy (fitting time only; inference is `sim.perf.learners`).

Two SiLU hidden layers, Adam with a warm-up + cosine learning-rate schedule, decoupled weight
decay, weighted Huber loss in log space (robust to the few broken rows the flags miss). Seeded:
the same data give the same network with the same BLAS and the same number of BLAS threads; the
thread count changes how the float32 matrix products sum, in the last bits (one thread and two give
weights ~1e-7 apart on the custom all-reduce family; the shipped models and the leave-one-GPU-out
runs use the 2-core development box's default of two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from sim.perf.learners import MlpParams

HIDDEN: Final = 64
EPOCHS: Final = 30
BATCH: Final = 512
LEARNING_RATE: Final = 3e-3
WEIGHT_DECAY: Final = 1e-4
HUBER_DELTA: Final = 0.05
WARMUP_FRAC: Final = 0.3


@dataclass(frozen=True, slots=True)
class MlpConfig:
    hidden: int = HIDDEN
    epochs: int = EPOCHS
    batch: int = BATCH
    learning_rate: float = LEARNING_RATE
    weight_decay: float = WEIGHT_DECAY
    huber_delta: float = HUBER_DELTA
    seed: int = 0


def _silu_and_grad(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))
    return z * s, s * (1.0 + z * (1.0 - s))


def _loss_and_grad(params: list[np.ndarray], x: np.ndarray, y: np.ndarray, w: np.ndarray,
                   huber_delta: float) -> tuple[float, list[np.ndarray]]:
    """Loss of one batch and its gradient with respect to `params` (W1, b1, W2, b2, W3, b3).

    The loss is sum_i w_i huber(r_i) / (delta n), r = net(x) - y, huber(r) = r^2 / 2 below delta
    and delta (|r| - delta / 2) above: per row, a squared error near the fit and an absolute error
    (slope 1) far from it. Weight decay is decoupled (`_adam_step`), so it is not in the loss.
    """
    z1 = x @ params[0] + params[1]
    a1, g1 = _silu_and_grad(z1)
    z2 = a1 @ params[2] + params[3]
    a2, g2 = _silu_and_grad(z2)
    out = (a2 @ params[4])[:, 0] + params[5][0]
    r = out - y
    small = np.abs(r) < huber_delta
    huber = np.where(small, 0.5 * r * r, huber_delta * (np.abs(r) - 0.5 * huber_delta))
    loss = float((w * huber).sum() / (huber_delta * len(y)))
    d = (np.where(small, r / huber_delta, np.sign(r)) * w / len(y))[:, None]
    d2 = (d @ params[4].T) * g2
    d1 = (d2 @ params[2].T) * g1
    return loss, [x.T @ d1, d1.sum(0), a1.T @ d2, d2.sum(0), a2.T @ d, d.sum(0)]


def _adam_step(params: list[np.ndarray], grads: list[np.ndarray], m1: list[np.ndarray], m2: list[np.ndarray],
               step: int, lr: float, weight_decay: float) -> None:
    """One Adam update in place (step counts from 1), with weight decay on the matrices only."""
    for j, g in enumerate(grads):
        m1[j] = 0.9 * m1[j] + 0.1 * g
        m2[j] = 0.999 * m2[j] + 0.001 * g * g
        upd = (m1[j] / (1 - 0.9 ** step)) / (np.sqrt(m2[j] / (1 - 0.999 ** step)) + 1e-8)
        if j % 2 == 0:
            upd = upd + weight_decay * params[j]
        params[j] = params[j] - lr * upd


def fit_mlp(x: np.ndarray, y: np.ndarray, w: np.ndarray, cfg: MlpConfig = MlpConfig()) -> MlpParams:
    """Fit y ~ net(x) with per-row weights `w`; returns plain-number parameters."""
    rng = np.random.default_rng(cfg.seed)
    n, p = x.shape
    lo, hi = x.min(0), x.max(0)
    mean = x.mean(0)
    scale = x.std(0)
    scale[scale < 1e-9] = 1.0
    z = ((x - mean) / scale).astype(np.float32)
    yt = y.astype(np.float32)
    wt = (w / w.mean()).astype(np.float32)

    def init(a: int, b: int, gain: float = 1.0) -> np.ndarray:
        out: np.ndarray = (rng.standard_normal((a, b)) * gain * np.sqrt(2.0 / a)).astype(np.float32)
        return out

    h = cfg.hidden
    params = [init(p, h), np.zeros(h, np.float32), init(h, h), np.zeros(h, np.float32),
              init(h, 1, 0.1), np.array([np.median(y)], np.float32)]
    m1 = [np.zeros_like(q) for q in params]
    m2 = [np.zeros_like(q) for q in params]
    batch = min(cfg.batch, n)
    per_epoch = max(1, n // batch)
    total = cfg.epochs * per_epoch
    step = 0
    for _ in range(cfg.epochs):
        perm = rng.permutation(n)
        for i in range(per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            _, grads = _loss_and_grad(params, z[idx], yt[idx], wt[idx], cfg.huber_delta)
            step += 1
            frac = step / total
            lr = cfg.learning_rate * (frac / WARMUP_FRAC if frac < WARMUP_FRAC
                                      else 0.5 * (1.0 + np.cos(np.pi * (frac - WARMUP_FRAC) / (1 - WARMUP_FRAC))))
            _adam_step(params, grads, m1, m2, step, lr, cfg.weight_decay)
    mats = (params[0], params[2], params[4])
    vecs = (params[1], params[3], params[5])
    return MlpParams(
        mean=tuple(float(v) for v in mean), scale=tuple(float(v) for v in scale),
        lo=tuple(float(v) for v in lo), hi=tuple(float(v) for v in hi),
        weights=tuple(tuple(tuple(float(v) for v in row) for row in m.astype(float)) for m in mats),
        biases=tuple(tuple(float(v) for v in b.astype(float)) for b in vecs))
