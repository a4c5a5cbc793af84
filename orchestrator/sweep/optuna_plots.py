"""Optuna's own interactive plots of a study, as HTML files for the parent MLflow run.

`optuna_pareto_front.html` (`optuna.visualization.plot_pareto_front`, several objectives; feasible
trials in colour, constraint violators grey) or `optuna_history.html` (`plot_optimization_history`,
one objective). They need plotly, part of the `orchestrate` extra; without it they are skipped
(the PNG of `orchestrator.sweep.report` is always there).
"""

from __future__ import annotations

import importlib.util
import logging
import warnings

import optuna
from optuna.trial import TrialState

from orchestrator.sweep.spec import SweepSpec

logger = logging.getLogger(__name__)


def optuna_plot_files(study: optuna.Study, spec: SweepSpec) -> dict[str, bytes]:
    if importlib.util.find_spec("plotly") is None:
        logger.warning("plotly is not installed: no Optuna HTML plots (python -m pip install plotly)")
        return {}
    if not any(t.state is TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return {}
    names = [o.metric for o in spec.objectives]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if len(names) >= 2:
            # Feasibility comes from the constraints the sweep stored with `Trial.set_constraint`.
            fig = optuna.visualization.plot_pareto_front(study, target_names=names)
            name = "optuna_pareto_front.html"
        else:
            fig = optuna.visualization.plot_optimization_history(study, target_name=names[0] if names else "Objective")
            name = "optuna_history.html"
    # One self-contained file (plotly.js inlined): it opens from MLflow's artifact view offline.
    return {name: fig.to_html(include_plotlyjs=True, full_html=True).encode()}

