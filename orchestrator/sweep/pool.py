"""A fixed pool of `SimShard` actors with unordered completion and dead-actor replacement.

Each actor holds up to `depth` submitted trials (Ray queues them on the actor), so an actor
never idles while the driver handles a result. `wait` returns whichever results are ready
(`ray.wait` over all outstanding references), never blocking on the slowest trial. When an
actor dies (killed, out of memory, node lost) its slot gets a fresh actor and every trial it
held is submitted again; a trial whose actors died `max_attempts` times comes back `FAILED`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from orchestrator.sweep.actors import SimShard
from orchestrator.sweep.results import TrialInput, TrialResult, TrialStatus
from sim.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Slot:
    index: int
    generation: int
    actor: Any
    outstanding: dict[Any, TrialInput] = field(default_factory=dict)
    """ObjectRef -> trial, for trials submitted to this actor and not yet collected."""


class ShardPool:
    def __init__(self, base_ref: Any, *, num_actors: int, depth: int = 2, render_artifacts: bool = True,
                 name_prefix: str = "kernelsight", max_attempts: int = 3, start_timeout_s: float = 120.0) -> None:
        if num_actors < 1 or depth < 1:
            raise ValueError(f"num_actors={num_actors} and depth={depth} must be >= 1")
        self._base_ref = base_ref
        self._render = render_artifacts
        self._prefix = name_prefix
        self._depth = depth
        self.max_attempts = max_attempts
        self._slots = [self._start(i, 0) for i in range(num_actors)]
        self._check_first_actor(start_timeout_s)
        self._where: dict[Any, _Slot] = {}
        self.num_restarts = 0
        self.num_resubmitted = 0

    def _start(self, index: int, generation: int) -> _Slot:
        try:
            actor = SimShard.options(name=self.actor_name(index, generation)).remote(  # type: ignore[attr-defined]
                self._base_ref, self._render)
        except RayError as exc:
            raise _refused(exc) from exc
        return _Slot(index=index, generation=generation, actor=actor)

    def _check_first_actor(self, timeout_s: float) -> None:
        """Fail fast, before any trial is lost, when the cluster kills or cancels the actors it creates.

        An actor still waiting for a CPU after `timeout_s` is not an error: the cluster may be busy.
        """
        try:
            ray.get(self._slots[0].actor.pid.remote(), timeout=timeout_s)
        except GetTimeoutError:
            logger.warning("the first simulator actor has not started after %.0f s; going on", timeout_s)
        except RayError as exc:
            raise _refused(exc) from exc

    def actor_name(self, index: int, generation: int) -> str:
        return f"{self._prefix}-shard{index}-gen{generation}"

    def current_actor_names(self) -> list[str]:
        return [self.actor_name(s.index, s.generation) for s in self._slots]

    @property
    def render_artifacts(self) -> bool:
        """Whether trials get their stacked-bar PNG (`--no-trial-plots` turns it off)."""
        return self._render

    @property
    def num_actors(self) -> int:
        return len(self._slots)

    def num_in_flight(self) -> int:
        return len(self._where)

    def has_room(self) -> bool:
        """Fewer than `depth` trials per actor are outstanding."""
        return self.num_in_flight() < self._depth * len(self._slots)

    def submit(self, trial: TrialInput) -> None:
        slot = min(self._slots, key=lambda s: len(s.outstanding))
        ref = slot.actor.evaluate.remote(trial)
        slot.outstanding[ref] = trial
        self._where[ref] = slot

    def wait(self, timeout_s: float | None) -> list[TrialResult]:
        """Results ready within `timeout_s` (possibly none); resubmits the trials of dead actors."""
        if not self._where:
            return []
        ready, _ = ray.wait(list(self._where), num_returns=1, timeout=timeout_s)
        out: list[TrialResult] = []
        for ref in ready:
            slot = self._where.pop(ref, None)
            if slot is None:
                continue  # belonged to an actor already replaced
            trial = slot.outstanding.pop(ref)
            try:
                out.append(ray.get(ref))
            except RayActorError as exc:
                slot.outstanding[ref] = trial
                self._where[ref] = slot
                out += self._replace(slot, exc)
            except RayError as exc:
                out.append(TrialResult(number=trial.number, status=TrialStatus.FAILED, params=dict(trial.params),
                                       reason=f"Ray could not run the trial: {exc!r}"))
        return out

    def _replace(self, slot: _Slot, exc: Exception) -> list[TrialResult]:
        """Start a new actor in `slot`'s place and resubmit what the dead one held."""
        orphans = list(slot.outstanding.values())
        for ref in slot.outstanding:
            self._where.pop(ref, None)
        logger.warning("actor %s died (%s); replacing it and re-running %d trial(s)",
                       self.actor_name(slot.index, slot.generation), type(exc).__name__, len(orphans))
        ray.kill(slot.actor, no_restart=True)
        self._slots[slot.index] = self._start(slot.index, slot.generation + 1)
        self.num_restarts += 1
        failed: list[TrialResult] = []
        for trial in orphans:
            if trial.attempt >= self.max_attempts:
                failed.append(TrialResult(
                    number=trial.number, status=TrialStatus.FAILED, params=dict(trial.params),
                    reason=f"the actor evaluating this trial died {trial.attempt} times (last: {exc!r})"))
                continue
            self.num_resubmitted += 1
            self.submit(replace(trial, attempt=trial.attempt + 1))
        return failed

    def close(self) -> None:
        for slot in self._slots:
            ray.kill(slot.actor, no_restart=True)
        self._slots = []
        self._where = {}


def _refused(exc: RayError) -> ConfigError:
    """The cluster would not run a simulator actor; the usual cause is a driver whose Ray auth mode
    differs from the cluster's (the actor is cancelled or dies at once)."""
    return ConfigError(
        source="ray cluster", key="RAY_AUTH_MODE", value=os.environ.get("RAY_AUTH_MODE", "(unset)"),
        rule=f"the cluster would not start a simulator actor ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
             "check that the driver's auth mode matches the cluster's: RAY_AUTH_MODE=disabled for a cluster "
             "started without token auth, RAY_AUTH_MODE=token with its RAY_AUTH_TOKEN for one with it")
