"""Which drafts a verification accepts: seeded per request, independent of scheduling.

Each request draws its own stream of uniforms u_1, u_2, ... (a numpy Generator seeded from the
scenario seed and the request id), one per verification step. With per-position conditional rates
r_1..r_k, the survival thresholds S_j = r_1 x ... x r_j decrease, and the step accepts
a = #{j : u < S_j} drafts, so P(a >= j) = S_j exactly (EAGLE's n-alpha chain). A step whose drafts
the token budget cut to d < k accepts min(a, d). The same seed gives the same accepted counts
whatever the batch, the replica or preemptions (the n-th verification of a request always uses u_n),
and rates of 1 and 0 make it deterministic (rates [1, 0] with k = 2 accept exactly one draft).
"""

from __future__ import annotations

import numpy as np

_BLOCK = 256
"""Uniforms drawn per request at a time."""


class AcceptanceSampler:
    def __init__(self, rates: tuple[float, ...], seed: int, stream: int = 1) -> None:
        """`rates`: per draft position; `seed`: the scenario seed; `stream`: the child of
        `SeedSequence(seed)` reserved for acceptance (the workload generator uses child 0)."""
        self.rates = rates
        self._thresholds = np.cumprod(np.asarray(rates, dtype=float))
        self._seed = seed
        self._stream = stream
        self._draws: dict[int, tuple[list[int], int]] = {}
        """Per request: its accepted counts drawn so far and how many it has used."""

    def _more(self, request_id: int, start: int) -> list[int]:
        seq = np.random.SeedSequence(self._seed, spawn_key=(self._stream, request_id, start // _BLOCK))
        u = np.random.default_rng(seq).random(_BLOCK)
        counts: list[int] = (u[:, None] < self._thresholds[None, :]).sum(axis=1).tolist()
        return counts

    def accepted(self, request_id: int, num_drafts: int) -> int:
        """Drafts the request's next verification accepts (of `num_drafts` proposed)."""
        entry = self._draws.get(request_id)
        if entry is None:
            entry = (self._more(request_id, 0), 0)
        counts, used = entry
        if used == len(counts):
            counts = counts + self._more(request_id, used)
        self._draws[request_id] = (counts, used + 1)
        a = counts[used]
        return a if a < num_drafts else num_drafts

    def forget(self, request_id: int) -> None:
        """Drop a finished request's draws."""
        self._draws.pop(request_id, None)
