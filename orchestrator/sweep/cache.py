"""Trial results keyed by scenario hash, so a configuration is simulated once per sweep.

Two trials whose parameters resolve to the same scenario (a duplicate suggestion, or values
that vLLM's defaults make equal) share one simulation: the second either finds the result here
or, while the first is still running, waits for it. Only results that depend on the scenario
alone are kept (`OK`, `INFEASIBLE`); a failure may be an infrastructure accident and is retried.
"""

from __future__ import annotations

from orchestrator.sweep.results import TrialInput, TrialResult, TrialStatus

_CACHEABLE = (TrialStatus.OK, TrialStatus.INFEASIBLE)


class ResultCache:
    def __init__(self) -> None:
        self._done: dict[str, TrialResult] = {}
        self._running: dict[str, list[TrialInput]] = {}
        self.num_hits = 0

    def __len__(self) -> int:
        return len(self._done)

    def lookup(self, scenario_hash: str) -> TrialResult | None:
        return self._done.get(scenario_hash)

    def claim(self, scenario_hash: str, trial: TrialInput) -> bool:
        """True if `trial` should run; False if another trial with this hash runs and `trial` now waits."""
        waiters = self._running.get(scenario_hash)
        if waiters is None:
            self._running[scenario_hash] = []
            return True
        waiters.append(trial)
        return False

    def settle(self, scenario_hash: str, result: TrialResult) -> list[TrialInput]:
        """Record the running trial's result; return the trials that waited on it.

        When the result is not cacheable the waiters are returned all the same, and the caller
        runs them itself.
        """
        waiters = self._running.pop(scenario_hash, [])
        self.put(result)
        return waiters

    def put(self, result: TrialResult) -> None:
        if result.status in _CACHEABLE and result.scenario_hash and result.scenario_hash not in self._done:
            self._done[result.scenario_hash] = result

    def hit(self, scenario_hash: str, trial: TrialInput) -> TrialResult | None:
        """The cached result for `scenario_hash` re-addressed to `trial`, or None; counts hits."""
        cached = self._done.get(scenario_hash)
        if cached is None:
            return None
        self.num_hits += 1
        return cached.for_trial(trial.number, trial.params)
