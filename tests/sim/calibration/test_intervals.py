"""Split-conformal kernel intervals: the quantile rule by hand, coverage on synthetic residuals, the
shipped table, and the seeded per-family perturbation of the efficiency model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sim.calibration.intervals import (
    IntervalTable,
    balanced,
    conformal_bounds,
    fit_tier,
    load_intervals,
    nested_coverage,
    sample_log_factors,
    shipped_intervals,
    table_from_logo,
)
from sim.dtypes import DType
from sim.errors import ConfigError
from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.efficiency import Efficiency, RooflineEfficiency
from sim.perf.perturbed import PerturbedEfficiency
from sim.provenance import Provenance
from sim.specs.catalog import load_hardware


def test_conformal_bounds_by_hand() -> None:
    # n = 19: k = ceil(20 * 0.95) = 19 -> the largest and the smallest residual.
    assert conformal_bounds(np.arange(1.0, 20.0)) == (1.0, 19.0)
    # n = 39: k = ceil(40 * 0.95) = 38 -> 38th smallest (38) and 38th largest (2); order does not matter.
    r = np.arange(1.0, 40.0)
    assert conformal_bounds(r[::-1].copy()) == (2.0, 38.0)
    # n = 10: k = ceil(11 * 0.95) = 11 > n -> no finite interval.
    assert conformal_bounds(np.arange(10.0)) == (-math.inf, math.inf)
    # alpha = 0.5: n = 9, k = ceil(10 * 0.75) = 8 -> (r[1], r[7]).
    assert conformal_bounds(np.arange(9.0), alpha=0.5) == (1.0, 7.0)


def test_balanced_weighs_every_gpu_the_same() -> None:
    parts = balanced([np.zeros(1000), np.ones(10), np.full(50, 2.0)])
    assert [len(p) for p in parts] == [10, 10, 10]
    assert [float(p.mean()) for p in parts] == [0.0, 1.0, 2.0]


def test_coverage_on_exchangeable_synthetic_gpus_is_near_nominal() -> None:
    """Five 'GPUs' whose residuals come from one distribution (different sizes): the nested
    leave-one-out intervals cover about 90% of each held-out GPU's rows, at the nominal width."""
    rng = np.random.default_rng(7)
    gpus = {f"g{i}": {"cross-generation": {"gemm": rng.normal(0.1, 0.3, n)}}
            for i, n in enumerate((400, 2000, 800, 5000, 1200))}
    rows = nested_coverage(gpus, tuple(gpus))
    assert len(rows) == 5
    for r in rows:
        assert 0.86 <= r["coverage"] <= 0.94, r
        # width of N(0.1, 0.3) 90% interval in latency terms: exp(0.1 + 1.645 * 0.3) - exp(0.1 - 1.645 * 0.3)
        assert r["rel_width"] == pytest.approx(math.exp(0.1 + 0.4935) - math.exp(0.1 - 0.4935), rel=0.12)
    # an evaluation GPU (not in dev_gpus) is scored with all dev quantiles and never fits one
    shifted = {**gpus, "eval": {"cross-generation": {"gemm": rng.normal(2.0, 0.3, 500)}}}
    again = {(r["gpu"], r["family"]): r["coverage"] for r in nested_coverage(shifted, tuple(gpus))}
    assert again[("eval", "gemm")] < 0.2
    assert all(again[(g, "gemm")] == r["coverage"] for g, r in zip(gpus, rows, strict=True))


def _two_architecture_classes(seed: int) -> tuple[dict[str, dict[str, dict[str, np.ndarray]]], dict[str, int]]:
    """Two 'GPUs' of one SM version whose residuals are narrow, three of SM versions of their own
    whose residuals are wide (as leave-one-GPU-out makes them: a GPU like one in training is easy)."""
    rng = np.random.default_rng(seed)
    arch = {"s1": 90, "s2": 90, "n1": 80, "n2": 89, "n3": 120}
    res = {g: {"cross-generation": {"gemm": rng.normal(0.0, 0.1 if g.startswith("s") else 0.5, 3000)},
               "roofline": {"gemm": rng.normal(0.0, 0.3, 300)}} for g in arch}
    return res, arch


def test_architecture_classes_calibrate_each_class() -> None:
    """Pooled over all dev GPUs, a GPU of a new architecture is under-covered and one of a seen
    architecture over-covered; with the classes each is near nominal."""
    res, arch = _two_architecture_classes(11)
    pooled = {r["gpu"]: r for r in nested_coverage(res, tuple(arch)) if r["tier"] == "cross-generation"}
    assert all(pooled[g]["coverage"] < 0.85 for g in ("n1", "n2", "n3"))
    assert all(pooled[g]["coverage"] > 0.97 for g in ("s1", "s2"))
    rows = nested_coverage(res, tuple(arch), architectures=arch)
    by_class = {r["gpu"]: r for r in rows if r["tier"] == "cross-generation"}
    for g, r in by_class.items():
        assert 0.86 <= r["coverage"] <= 0.94, r
        assert r["architecture"] == ("seen-architecture" if g.startswith("s") else "new-architecture")
    assert by_class["s1"]["rel_width"] < 0.5 < by_class["n1"]["rel_width"]
    # roofline fits nothing: no classes
    assert all(r["architecture"] == "" for r in rows if r["tier"] == "roofline")


def test_table_by_architecture_class(tmp_path: Path) -> None:
    res, arch = _two_architecture_classes(5)
    res["s1"]["cross-generation"]["nccl"] = np.random.default_rng(1).normal(0.2, 0.3, 200)
    table = table_from_logo(res, tuple(arch), dict.fromkeys(arch, "x"), "test", architectures=arch)
    assert table.seen_sm_versions == (80, 89, 90, 120)
    assert {"cross-generation:seen-architecture", "cross-generation:new-architecture"} <= set(table.tiers)
    assert "roofline:new-architecture" not in table.tiers
    path = tmp_path / "iv.json"
    table.save(path)
    loaded = load_intervals(path)
    assert loaded.seen_sm_versions == (80, 89, 90, 120)
    assert loaded.architecture("cross-generation", 100) == "new-architecture"
    assert loaded.architecture("cross-generation", 89) == "seen-architecture"
    assert loaded.architecture("roofline", 100) is None
    # A GPU without an SM version (a non-NVIDIA part) is of no dev GPU's kind: the new-architecture table.
    assert loaded.architecture("cross-generation", None) == "new-architecture"
    seen, new = loaded.family("cross-generation", "gemm", 90), loaded.family("cross-generation", "gemm", 100)
    assert seen is not None and new is not None and seen.relative_width() < 0.5 < new.relative_width()
    assert loaded.family("cross-generation", "gemm") == new
    # nccl only in the seen class: a new architecture falls back to the tier's own nccl interval
    assert loaded.family("cross-generation", "nccl", 100) == loaded.tiers["cross-generation"]["nccl"]
    point = np.ones(1)
    fams = np.array(["gemm"], dtype=object)
    assert loaded.bounds("cross-generation", fams, point, 90)[1] < loaded.bounds("cross-generation", fams, point, 100)[1]
    draws = [sample_log_factors(loaded, "cross-generation", ["gemm"], np.random.default_rng(i), 90)["gemm"]
             for i in range(50)]
    assert seen.lo_log <= min(draws) and max(draws) <= seen.hi_log
    path.write_text(path.read_text().replace('"cross-generation:new-architecture"', '"cross-generation:other"'))
    with pytest.raises(ConfigError, match="tier must be one of"):
        load_intervals(path)


def test_table_round_trip_bounds_and_samples(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    res = {g: {"cross-generation": {"gemm": rng.normal(0, 0.2, 300), "nccl": rng.normal(0.3, 0.5, 100)}}
           for g in ("a", "b", "c")}
    res["b200_sxm"] = {"cross-generation": {"gemm": np.full(100, 9.0)}}  # evaluation only: never used
    table = table_from_logo(res, ("a", "b", "c"), {"a": "x", "b200_sxm": "y"}, "test")
    assert table.data_sha256 == {"aiconfigurator/a": "x"}  # the calibration artifacts' keys
    gemm = table.tiers["cross-generation"]["gemm"]
    assert gemm.n == 900 and gemm.hi_log < 1.0
    path = tmp_path / "iv.json"
    table.save(path)
    loaded = load_intervals(path)
    assert loaded.tiers["cross-generation"]["gemm"].lo_log == pytest.approx(gemm.lo_log, rel=1e-5)
    point = np.array([1.0, 2.0, 3.0])
    lo, hi = loaded.bounds("cross-generation", np.array(["gemm", "nccl", "unknown"], dtype=object), point)
    assert (lo < point).all() and (point < hi).all()
    pooled = loaded.tiers["cross-generation"]["all"]
    assert hi[2] / 3.0 == pytest.approx(math.exp(pooled.hi_log))  # a family without its own: the pooled one
    assert loaded.bounds("roofline", np.array(["gemm"], dtype=object), point[:1]) == (point[:1], point[:1])
    a = sample_log_factors(loaded, "cross-generation", ["nccl", "gemm", "moe"], np.random.default_rng(3))
    b = sample_log_factors(loaded, "cross-generation", ["gemm", "moe", "nccl"], np.random.default_rng(3))
    assert a == b and list(a) == ["gemm", "moe", "nccl"]
    for fam, v in a.items():
        fi = loaded.family("cross-generation", fam)
        assert fi is not None and fi.lo_log <= v <= fi.hi_log


def test_load_rejects_unknown_keys(tmp_path: Path) -> None:
    table = IntervalTable(tiers={"cross-generation": fit_tier({"gemm": [np.linspace(-1, 1, 50)]})},
                          data_sha256={}, produced_by="t")
    path = tmp_path / "iv.json"
    table.save(path)
    path.write_text(path.read_text().replace('"produced_by"', '"produced"'))
    with pytest.raises(ConfigError, match="keys must be"):
        load_intervals(path)


def test_shipped_table_is_fitted_on_dev_gpus_only() -> None:
    table = shipped_intervals()
    assert table is not None
    assert "aiconfigurator/b200_sxm" not in table.data_sha256 and len(table.data_sha256) == 6
    assert "vidur/compute_mlp_ops.csv.gz" in table.data_sha256  # the pointwise rows' table
    assert table.seen_sm_versions == (80, 89, 90, 120)
    for tier in ("cross-generation", "target-measured"):
        for key in (tier, f"{tier}:seen-architecture", f"{tier}:new-architecture"):
            fams = table.tiers[key]
            assert "all" in fams
            assert all(f.lo_log <= 0.0 <= f.hi_log for f in fams.values())


class _Half:
    def efficiency(self, work: KernelWork, hw: object) -> Efficiency:
        return Efficiency(0.5, Provenance.TRANSFERRED)


def test_perturbed_efficiency_scales_one_family_and_caps_at_roofline() -> None:
    hw = load_hardware("h100_sxm")
    gemm = KernelWork(kind=KernelKind.GEMM, name="g", dtype=DType.BFLOAT16, flops=1e12, shape=(64, 64, 64))
    norm = KernelWork(kind=KernelKind.NORM, name="n", dtype=DType.BFLOAT16, activation_bytes=1e6)
    model = PerturbedEfficiency(_Half(), {"gemm": math.log(2.0), "pointwise": math.log(0.25)})
    assert model.efficiency(gemm, hw).value == pytest.approx(0.25)  # 2x slower
    assert model.efficiency(norm, hw).value == 1.0  # 4x faster than 0.5 would beat the roofline: capped
    assert model.efficiency(gemm, hw).provenance is Provenance.TRANSFERRED
    roof = PerturbedEfficiency(RooflineEfficiency(), {"gemm": math.log(2.0)})
    from sim.perf.efficiency import KernelColumns

    values, _ = roof.efficiency_columns(KernelColumns.of([gemm, gemm]), hw)
    assert values.tolist() == [0.5, 0.5]
