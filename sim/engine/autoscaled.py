"""An aggregated fleet whose replicas come and go: `Simulation` plus `[autoscaling]`.

The replica slots are the scenario's `data_parallel_size` replicas; each is off, starting,
active or draining. The loop is `Simulation`'s; two kinds of control event join the heap (as
`DisaggregatedSimulation`'s transfers do, with negative indices): the evaluation tick (-1) at
k x `interval_s`, which asks the policy (`sim.engine.autoscaler.decide`) for a replica count
and carries it out, and a replica's start-up end (-2 - r).

- Scale-up: a draining replica is taken back first (it still holds its weights; it is active at
  once), then an off slot starts: it is paid from the decision and takes traffic
  `startup_delay_s` later. Replicas provisioned (active + starting + draining) never exceed
  `max_replicas`.
- Scale-down: starting replicas are cancelled first (latest first), then active replicas with
  the fewest outstanding requests (ties: the highest index) are drained: the router stops sending
  them requests, they finish what they hold and are released when empty.
- The router sees only the active replicas (`Simulation._route_in` over their indices).
- With `look_back_period_s`, a third kind (-2 - n, n the slots) samples each active replica's
  metrics at k x `metrics_record_interval_s` (0.5 s by default, as Ray Serve's replicas record
  theirs), and every evaluation samples at its own instant before it decides; the policy sees
  each replica's mean over its samples of the window (`sim.engine.autoscaler.windowed_observation`).
  A replica's samples start afresh when it starts or drains.
- Ticks (and samples) stop once no arrival is left and no replica is busy.

Cost: a replica is paid from its start (t = 0 for the initial ones) to its release or the end
of the run (the last request's finish): `replica_s`; `startup_s` is the part spent loading.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, Literal

from sim.engine.autoscaler import FleetObservation, PolicyState, ReplicaSample, decide, windowed_observation
from sim.engine.pricer import StepPricer
from sim.engine.records import RequestRecord
from sim.engine.simulation import SimLimits, Simulation
from sim.engine.step_log import StepLog
from sim.serving.request import RequestState
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.autoscaling import AutoscalingSpec
from sim.specs.engine import RouterName

Status = Literal["off", "starting", "active", "draining"]
_TICK: Final = -1


class AutoscaledSimulation(Simulation):
    def __init__(self, *, replicas: Sequence[VllmV1Scheduler], pricer: StepPricer, router: RouterName,
                 max_concurrency: int | None, limits: SimLimits, spec: AutoscalingSpec, max_num_seqs: int,
                 progress: Callable[[int], None] | None = None, step_log: StepLog | None = None,
                 client_latency_s: float = 0.0) -> None:
        super().__init__(replicas=replicas, pricer=pricer, router=router, max_concurrency=max_concurrency,
                         limits=limits, progress=progress, step_log=step_log, client_latency_s=client_latency_s)
        assert spec.max_replicas is not None and spec.initial_replicas is not None
        assert spec.max_replicas <= len(replicas)
        self._spec = spec
        self._max_num_seqs = max_num_seqs
        n = len(replicas)
        init = spec.initial_replicas
        active: list[Status] = ["active"] * init
        off: list[Status] = ["off"] * (n - init)
        self._status = active + off
        self._since_s = [0.0] * n
        """When each provisioned replica started being paid."""
        self._ready_s = [math.inf] * n
        """Start-up end of each starting replica."""
        self._active = list(range(init))
        """Indices of the active replicas, ascending (what the router sees)."""
        self._policy = PolicyState()
        self._tick = 0
        self._samples: list[deque[ReplicaSample]] = [deque() for _ in range(n)]
        """Each replica's look-back samples (with `look_back_period_s`), oldest first."""
        self._record_idx = -2 - n
        """Heap index of the look-back sampling events (past the start-up ends' -2 - r)."""
        self._num_records = 0
        self.replica_s = 0.0
        self.startup_s = 0.0
        self.num_started = 0
        self.num_drained = 0
        self.peak_replicas = init
        self.timeline: list[tuple[float, int, int, int]] = [(0.0, init, 0, 0)]
        """(time_s, active, starting, draining) after each change."""
        self.end_s = 0.0

    def _run(self, requests: Sequence[RequestState]) -> list[RequestRecord]:
        self._push(self._spec.interval_s, _TICK)
        if self._spec.look_back_period_s is not None:
            self._push(self._spec.record_interval_s, self._record_idx)
        records = super()._run(requests)
        # The engine's last finish: the records' times add the client's latency outside the engine.
        self.end_s = max((r.finish_s for r in records), default=self._client_latency_s) - self._client_latency_s
        for r, status in enumerate(self._status):
            if status != "off":
                paid_s = max(self.end_s - self._since_s[r], 0.0)
                self.replica_s += paid_s
                if status == "starting":
                    self.startup_s += paid_s
        return records

    def _route(self, req: RequestState) -> int:
        return self._route_in(req, self._active, self._router, 0)

    def _on_step_done(self, idx: int) -> None:
        if idx == _TICK:
            self._on_tick()
        elif idx == self._record_idx:
            self._on_record()
        elif idx < 0:
            self._on_ready(-idx - 2)
        else:
            super()._on_step_done(idx)
            if self._status[idx] == "draining":
                self._release_if_empty(idx)

    def _finished(self) -> bool:
        """No arrival left, none held and no replica busy: nothing will happen any more."""
        return math.isinf(self._next_arrival_s) and not self._held and not any(r.busy for r in self._replicas)

    def _on_tick(self) -> None:
        if self._finished():
            return  # no further ticks
        self._tick += 1
        self._push((self._tick + 1) * self._spec.interval_s, _TICK)
        # A start-up that ends at this instant has ended for the evaluation, whichever of the two
        # events the heap holds first (their order depends on when each was queued).
        for r in [r for r, s in enumerate(self._status) if s == "starting" and self._ready_s[r] <= self.now_s]:
            self._on_ready(r)
        look_back_s = self._spec.look_back_period_s
        if look_back_s is None:
            obs = self.observe()
        else:
            self._sample()
            obs = windowed_observation(now_s=self.now_s, samples=[self._samples[j] for j in self._active],
                                       num_starting=self._count("starting"), look_back_s=look_back_s,
                                       max_num_seqs=self._max_num_seqs)
        target, self._policy = decide(self._spec, obs, self._policy)
        self._scale_to(target)

    def _on_record(self) -> None:
        if self._finished():
            return  # no further samples
        self._num_records += 1
        self._push((self._num_records + 1) * self._spec.record_interval_s, self._record_idx)
        self._sample()

    def _sample(self) -> None:
        """Each active replica's metrics now join its look-back window (replacing a sample taken
        at this same instant); samples out of the window are dropped."""
        assert self._spec.look_back_period_s is not None
        now = self.now_s
        start_s = now - self._spec.look_back_period_s
        for j in self._active:
            s = self._replicas[j].scheduler
            assert isinstance(s, VllmV1Scheduler)
            window = self._samples[j]
            if window and window[-1].time_s == now:
                window.pop()
            window.append(ReplicaSample(now, s.num_outstanding(), s.num_waiting(), self.replica_kv_usage_frac(j),
                                        s.num_running()))
            while window[0].time_s <= start_s:
                window.popleft()

    def observe(self) -> FleetObservation:
        scheds = [self._replicas[j].scheduler for j in self._active]
        ongoing = waiting = running = 0
        kv = 0.0
        for j, s in zip(self._active, scheds, strict=True):
            assert isinstance(s, VllmV1Scheduler)
            ongoing += s.num_outstanding()
            waiting += s.num_waiting()
            running += s.num_running()
            kv += self.replica_kv_usage_frac(j)  # a replica running decodes ahead reports them too
        return FleetObservation(now_s=self.now_s, num_active=len(scheds), num_starting=self._count("starting"),
                                ongoing_requests=ongoing, waiting_requests=waiting, kv_usage=kv,
                                running_frac=running / self._max_num_seqs)

    def _count(self, status: Status) -> int:
        return sum(1 for s in self._status if s == status)

    def _scale_to(self, target: int) -> None:
        status = self._status
        current = len(self._active) + self._count("starting")
        if target > current:
            k = target - current
            for r in [r for r, s in enumerate(status) if s == "draining"][:k]:
                self._activate(r)
                k -= 1
            room = self._spec.max_replicas - sum(1 for s in status if s != "off")  # type: ignore[operator]
            for r in [r for r, s in enumerate(status) if s == "off"][:min(k, room)]:
                self._start(r)
        elif target < current:
            k = current - target
            starting = sorted((r for r, s in enumerate(status) if s == "starting"), key=lambda r: -self._ready_s[r])
            for r in starting[:k]:
                self._cancel(r)
                k -= 1
            if k > 0:
                load = {r: self._replicas[r].scheduler.num_outstanding() for r in self._active}
                for r in sorted(self._active, key=lambda r: (load[r], -r))[:k]:
                    self._drain(r)
        self._log()

    def _activate(self, r: int) -> None:
        self._status[r] = "active"
        bisect.insort(self._active, r)

    def _start(self, r: int) -> None:
        # A replica loads afresh: nothing of what it cached before it was released is still there.
        self._replicas[r].scheduler.kv.reset_prefix_cache()
        self._samples[r].clear()
        self._status[r] = "starting"
        self._since_s[r] = self.now_s
        self._ready_s[r] = self.now_s + self._spec.startup_delay_s
        self.num_started += 1
        self._push(self._ready_s[r], -2 - r)
        self.peak_replicas = max(self.peak_replicas, sum(1 for s in self._status if s != "off"))

    def _cancel(self, r: int) -> None:
        self._status[r] = "off"
        paid_s = self.now_s - self._since_s[r]
        self.replica_s += paid_s
        self.startup_s += paid_s
        self._ready_s[r] = math.inf

    def _on_ready(self, r: int) -> None:
        if self._status[r] != "starting" or self._ready_s[r] != self.now_s:
            return  # cancelled (and perhaps started again since), or activated by a tick at this instant
        if self._finished():
            # The run has ended (its last request finished before now): the replica stays starting,
            # and `_run` pays its start-up up to that end only.
            return
        self.startup_s += self.now_s - self._since_s[r]
        self._ready_s[r] = math.inf
        self._activate(r)
        self._log()

    def _drain(self, r: int) -> None:
        self._status[r] = "draining"
        self._active.remove(r)
        self._samples[r].clear()
        self.num_drained += 1
        self._release_if_empty(r)

    def _release_if_empty(self, r: int) -> None:
        replica = self._replicas[r]
        if replica.busy or replica.scheduler.num_outstanding():
            return
        self._status[r] = "off"
        self.replica_s += self.now_s - self._since_s[r]
        self._log()

    def _log(self) -> None:
        entry = (self.now_s, len(self._active), self._count("starting"), self._count("draining"))
        last = self.timeline[-1]
        if entry[1:] == last[1:]:
            return
        if last[0] == entry[0]:
            self.timeline[-1] = entry
        else:
            self.timeline.append(entry)
