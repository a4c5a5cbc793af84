"""Kernel efficiency model: hand-computed cases, invariants, artifacts, tiers and CLI contracts."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli import main
from sim.calibration.artifact import CalibrationArtifact, from_json, load_artifact
from sim.calibration.batch import family_batches, predict_latency_s
from sim.calibration.plan import MAX_POINTS, microbench_plan
from sim.calibration.rows import ROW_COLUMNS, row_to_work
from sim.calibration.select import CALIBRATION_DIR, efficiency_model_for, load_for_tier
from sim.errors import ConfigError
from sim.perf.fitted import NUM_INTERACTED, FamilyParams, FittedEfficiency
from sim.perf.kernel_features import feature_names
from sim.perf.roofline import roofline
from sim.provenance import Provenance
from sim.specs.catalog import list_hardware, load_hardware

pytestmark = pytest.mark.unit
H100 = load_hardware("h100_sxm")
ROWS = [
    {"kernel": "gemm", "backend": "sglang", "dtype": "bfloat16", "m": "128", "n": "4096", "k": "4096"},
    {"kernel": "gemm", "dtype": "fp8", "m": "1", "n": "8192", "k": "8192"},
    {"kernel": "context_attention", "batch_size": "4", "seq_len": "2048", "num_heads": "32",
     "num_kv_heads": "8", "head_dim": "128"},
    {"kernel": "context_attention", "batch_size": "2", "seq_len": "300", "num_heads": "8",
     "num_kv_heads": "8", "head_dim": "64", "window_size": "128", "kv_cache_dtype": "fp8"},
    {"kernel": "generation_attention", "batch_size": "64", "kv_len": "4095", "num_heads": "32",
     "num_kv_heads": "8", "head_dim": "128"},
    {"kernel": "nccl_all_reduce", "num_gpus": "8", "message_bytes": "1048576"},
    {"kernel": "nccl_alltoall", "num_gpus": "4", "message_bytes": "4096"},
    {"kernel": "custom_allreduce", "num_gpus": "4", "message_bytes": "65536", "variant": "vllm_graph"},
    {"kernel": "norm", "m": "512", "n": "4096"},
    {"kernel": "elementwise", "m": "512", "n": "14336", "variant": "silu_and_mul"},
]


def _cols(rows: list[dict[str, str]]) -> dict[str, np.ndarray]:
    return {c: np.array([r.get(c, "") for r in rows], dtype=object) for c in ROW_COLUMNS}


def test_vectorised_roofline_matches_row_to_work() -> None:
    cols = _cols(ROWS)
    lat, prov = predict_latency_s(cols, H100, None)
    for i, row in enumerate(ROWS):
        expected = roofline(row_to_work(row, number=i + 1, source="t"), H100).time_s()
        assert lat[i] == pytest.approx(expected, rel=1e-9), row
    assert set(prov.tolist()) == {int(Provenance.ROOFLINE)}


def test_hand_computed_gemm_roofline() -> None:
    lat, _ = predict_latency_s(_cols([ROWS[0]]), H100, None)
    flops, nbytes = 2 * 128 * 4096 * 4096, 2 * (4096 * 4096 + 128 * 4096 + 128 * 4096)
    assert lat[0] == pytest.approx(max(flops / 989e12, nbytes / 3.35e12))


def _toy_params(intercept: float) -> dict[str, FamilyParams]:
    out = {}
    for fam in ("gemm", "attn_prefill", "attn_decode", "pointwise", "nccl", "custom_allreduce"):
        n = len(feature_names(fam))
        levels = (("dtype", ("bfloat16", "fp8")),) if fam == "gemm" else ()
        coef = [intercept] + [0.0] * n + [0.5, 0.0] * bool(levels) + [0.0] * 2 * NUM_INTERACTED * bool(levels)
        out[fam] = FamilyParams(family=fam, categoricals=levels, coef=tuple(coef))
    return out


def test_constant_log_slowdown_gives_exact_efficiency() -> None:
    model = FittedEfficiency(_toy_params(math.log(2.0)))
    bf16 = row_to_work(ROWS[0], number=1, source="t")
    fp8 = row_to_work(ROWS[1], number=2, source="t")
    assert model.efficiency(bf16, H100).value == pytest.approx(math.exp(-math.log(2.0) - 0.5))
    assert model.efficiency(fp8, H100).value == pytest.approx(0.5)
    assert model.efficiency(fp8, H100).provenance is Provenance.TRANSFERRED


def test_negative_prediction_is_clipped_to_roofline() -> None:
    model = FittedEfficiency(_toy_params(-5.0))
    work = row_to_work(ROWS[1], number=1, source="t")
    assert model.efficiency(work, H100).value == 1.0


@pytest.mark.parametrize("tier", ["cross-generation", "target-measured", "auto"])
def test_shipped_models_keep_efficiency_in_unit_interval(tier: str) -> None:
    model = efficiency_model_for(H100, tier=tier)  # type: ignore[arg-type]
    for i, row in enumerate(ROWS):
        eff = model.efficiency(row_to_work(row, number=i + 1, source="t"), H100)
        assert 0.0 < eff.value <= 1.0
    lat, _ = predict_latency_s(_cols(ROWS), H100, model)  # type: ignore[arg-type]
    roof, _ = predict_latency_s(_cols(ROWS), H100, None)
    assert np.all(lat >= roof * (1 - 1e-12))


def test_scalar_and_vectorised_paths_agree() -> None:
    model = efficiency_model_for(H100, tier="target-measured", backend=None)
    assert isinstance(model, FittedEfficiency)
    lat, _ = predict_latency_s(_cols(ROWS), H100, model)
    for i, row in enumerate(ROWS):
        if row["kernel"] in ("custom_allreduce",):
            continue
        work = row_to_work({**row, "backend": ""}, number=i + 1, source="t")
        if row.get("backend"):
            continue
        expected = roofline(work, H100).time_s() / model.efficiency(work, H100).value
        assert lat[i] == pytest.approx(expected, rel=1e-9), row


def test_artifact_json_round_trip(tmp_path: Path) -> None:
    art = load_artifact(CALIBRATION_DIR / "h100_sxm.json")
    path = tmp_path / "a.json"
    art.save(path)
    again = load_artifact(path)
    assert again == art
    assert again.tier == "target-measured" and again.hardware == "h100_sxm"


def test_artifact_rejects_unknown_keys() -> None:
    data = json.loads((CALIBRATION_DIR / "cross_generation.json").read_text())
    data["pickle"] = "x"
    with pytest.raises(ConfigError, match="unknown key"):
        from_json(data, "t")


def test_cross_generation_tier_refuses_target_measurements(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="never reads target"):
        load_for_tier(H100, "cross-generation", str(CALIBRATION_DIR / "h100_sxm.json"))
    art = load_for_tier(H100, "cross-generation", None)
    assert isinstance(art, CalibrationArtifact) and art.tier == "cross-generation"
    assert "h100_sxm" not in (art.hardware or "")


def test_plan_budget_respected_for_every_gpu() -> None:
    for name in list_hardware():
        rows = microbench_plan(load_hardware(name))
        assert 0 < len(rows) <= MAX_POINTS
        assert all(set(r) == set(ROW_COLUMNS) for r in rows)


def test_plan_cli_writes_rows(tmp_path: Path) -> None:
    out = tmp_path / "plan.csv"
    assert main(["microbench", "plan", "--hardware", "l40s", "--out", str(out)]) == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(microbench_plan(load_hardware("l40s")))


@pytest.mark.parametrize("tier", ["roofline", "cross-generation", "target-measured"])
def test_predict_kernels_cli_contract(tmp_path: Path, tier: str) -> None:
    src = tmp_path / "rows.csv"
    with src.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROW_COLUMNS))
        w.writeheader()
        w.writerows([{c: r.get(c, "") for c in ROW_COLUMNS} for r in ROWS])
    for hw in ("h100_sxm", "gb300", "b60"):
        out = tmp_path / f"{hw}.csv"
        assert main(["predict-kernels", "--hardware", hw, "--tier", tier, "--in", str(src),
                     "--out", str(out)]) == 0
        with out.open() as f:
            got = list(csv.DictReader(f))
        assert len(got) == len(ROWS)
        assert all(float(r["predicted_latency_ms"]) > 0 for r in got)
        assert {r["provenance"] for r in got} <= {p.label() for p in Provenance}


def test_partial_table_calibrate(tmp_path: Path) -> None:
    d = tmp_path / "mb"
    d.mkdir()
    with (d / "nccl.csv").open("w") as f:
        f.write("nccl_version,nccl_version_reported,op,nccl_dtype,num_gpus,message_elems,latency_ms\n")
        for i, elems in enumerate([1024, 65536, 1048576, 16777216]):
            f.write(f"2.27.3,,all_reduce,half,8,{elems},{0.01 * (i + 1) ** 2}\n")
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--hardware", "h100_sxm", "--microbench", str(d), "--out", str(out)]) == 0
    art = load_artifact(out)
    assert art.families["nccl"].correction is not None
    assert art.families["gemm"].correction is None
    assert main(["calibrate", "--hardware", "h100_sxm", "--microbench", str(tmp_path / "nope"),
                 "--out", str(out)]) == 2


def test_family_batches_cover_every_row() -> None:
    got = sorted(int(i) for fb in family_batches(_cols(ROWS), H100) for i in fb.index)
    assert got == list(range(len(ROWS)))
