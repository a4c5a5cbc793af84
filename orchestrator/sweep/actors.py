"""`SimShard`: the Ray actor that evaluates trials. One CPU each; holds the base scenario.

The base scenario arrives once per actor as a `ray.put` reference, so each call ships only a
trial's parameters. Actors never log anywhere: they return `TrialResult`s to the driver.
"""

from __future__ import annotations

import dataclasses
import os

import ray

from orchestrator.sweep.evaluate import TrialEvaluator
from orchestrator.sweep.results import TrialInput, TrialResult
from sim.specs.scenario import Scenario


@ray.remote(num_cpus=1, max_restarts=0)
class SimShard:
    def __init__(self, base: Scenario, render_artifacts: bool) -> None:
        self._evaluator = TrialEvaluator(base, render_artifacts=render_artifacts)
        self._node_id = ray.get_runtime_context().get_node_id()

    def evaluate(self, trial: TrialInput) -> TrialResult:
        return dataclasses.replace(self._evaluator.evaluate(trial), ray_node_id=self._node_id)

    def pid(self) -> int:
        return os.getpid()
