"""kernelsight simulator: kernel-level LLM serving simulation without a GPU."""

from sim.api import __version__, load_scenario, predict_step
from sim.errors import ConfigError, InfeasibleScenario
from sim.graph.batch import BatchShape, PrefillChunk
from sim.provenance import Provenance
from sim.specs.engine import EngineParams
from sim.specs.hardware import HardwareSpec, LinkSpec
from sim.specs.model import ModelSpec, MoESpec
from sim.specs.scenario import Scenario
from sim.specs.slo import SloSpec
from sim.specs.workload import WorkloadSpec

__all__ = [
    "BatchShape",
    "ConfigError",
    "EngineParams",
    "HardwareSpec",
    "InfeasibleScenario",
    "LinkSpec",
    "MoESpec",
    "ModelSpec",
    "PrefillChunk",
    "Provenance",
    "Scenario",
    "SloSpec",
    "WorkloadSpec",
    "__version__",
    "load_scenario",
    "predict_step",
]
