"""Sweeps over scenario settings: TOML spec, Optuna search, Ray actors, MLflow records, capacity plans.

Importing this package (and `spec`, `space`, `objective`, `metrics`, `results`) needs neither Ray,
Optuna nor MLflow; the modules that do (`driver`, `pool`, `actors`, `study`, `tracking`,
`capacity`) import them at module level and are loaded only by `kernelsight sweep`.
"""
