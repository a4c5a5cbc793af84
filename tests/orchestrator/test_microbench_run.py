"""`kernelsight microbench run` without a GPU: plan -> dry run -> files in AIConfigurator's layout,
`calibrate` on them, the exit-2 refusals, resume, and the path without torch (subprocess)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from conftest import MEASURED_DATA, cli_without

from orchestrator.cli import main
from orchestrator.microbench.output import TABLE_COLUMNS
from orchestrator.microbench.points import family_of
from sim.calibration.artifact import load_artifact
from sim.calibration.plan import microbench_plan
from sim.calibration.rows import ROW_COLUMNS
from sim.measured import open_text, resolve
from sim.specs.catalog import load_hardware

H100_TABLES = MEASURED_DATA / "aiconfigurator" / "h100_sxm"
POINTWISE_ROWS = [
    {"kernel": "norm", "variant": "rmsnorm", "dtype": "bfloat16", "m": m, "n": 4096} for m in (1, 64, 1024, 8192)
] + [
    {"kernel": "elementwise", "variant": "silu_and_mul", "dtype": "bfloat16", "m": m, "n": 14336}
    for m in (1, 64, 1024, 8192)
] + [{"kernel": "sampling", "variant": "top_p", "dtype": "bfloat16", "m": 8, "n": 32000}]
FILE_OF = {"gemm": "gemm.csv.gz", "context_attention": "context_attention.csv.gz",
           "generation_attention": "generation_attention.csv.gz", "nccl": "nccl.csv",
           "custom_allreduce": "custom_allreduce.csv", "pointwise": "pointwise.csv"}


def write_plan(path: Path, step: int = 7) -> list[dict[str, str]]:
    """Every `step`-th point of the H100 plan (all families kept) plus pointwise rows."""
    rows = microbench_plan(load_hardware("h100_sxm"))
    kept = [r for i, r in enumerate(rows) if i % step == 0 or r["kernel"] == "custom_allreduce"]
    kept += [{c: str(r.get(c, "")) for c in ROW_COLUMNS} for r in POINTWISE_ROWS]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROW_COLUMNS))
        w.writeheader()
        w.writerows(kept)
    return kept


def read_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open_text(path) as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, str]]]:
    pytest.importorskip("torch", reason="the torch dry run needs torch (CPU build is enough)")
    base = tmp_path_factory.mktemp("mb")
    plan = write_plan(base / "plan.csv")
    out = base / "out"
    assert main(["microbench", "run", "--plan", str(base / "plan.csv"), "--out", str(out), "--device", "cpu",
                 "--dry-run"]) == 0
    return out, plan


def test_dry_run_writes_every_point_in_aiconfigurator_columns(dry_run: tuple[Path, list[dict[str, str]]]) -> None:
    out, plan = dry_run
    expected: dict[str, int] = {}
    for r in plan:
        name = FILE_OF[family_of(r["kernel"])]
        expected[name] = expected.get(name, 0) + 1
    written = {p.name for p in out.iterdir()}
    assert written == {*expected, "points.csv", "device.json"}
    for name, count in expected.items():
        header, rows = read_table(out / name)
        assert tuple(header) == TABLE_COLUMNS[name]
        assert len(rows) == count
        assert all(float(r["latency_ms"]) > 0 for r in rows)
    _, gemm = read_table(out / "gemm.csv.gz")
    assert {r["dtype"] for r in gemm} == {"bfloat16", "fp8", "fp8_block"}
    assert {r["backend"] for r in gemm} == {"torch"}
    _, nccl = read_table(out / "nccl.csv")
    assert {(r["op"], r["nccl_dtype"]) for r in nccl} >= {("all_reduce", "half"), ("alltoall", "half")}
    planned = {int(r["message_bytes"]) for r in plan if r["kernel"].startswith("nccl")}
    assert {int(r["message_elems"]) * 2 for r in nccl} == planned


def test_headers_equal_the_real_aiconfigurator_tables(dry_run: tuple[Path, list[dict[str, str]]]) -> None:
    out, _ = dry_run
    for name in ("gemm.csv.gz", "context_attention.csv.gz", "generation_attention.csv.gz", "nccl.csv",
                 "custom_allreduce.csv"):
        theirs, _ = read_table(resolve(H100_TABLES / name))
        ours, _ = read_table(out / name)
        assert ours == theirs, name


def test_points_and_device_json(dry_run: tuple[Path, list[dict[str, str]]]) -> None:
    out, plan = dry_run
    with (out / "points.csv").open() as f:
        points = list(csv.DictReader(f))
    assert len(points) == len(plan)
    assert {p["status"] for p in points} == {"measured"}
    assert {p["timing"] for p in points} == {"wall_clock"}
    # top_p sampling has no implementation: the dry run times a stand-in and says why
    top_p = next(p for p in points if p["variant"] == "top_p")
    assert top_p["kernel_source"] == "dry_run_standin"
    assert "variant='top_p'" in top_p["reason"] and "sampling/greedy" in top_p["reason"]
    info = json.loads((out / "device.json").read_text())
    assert info["dry_run"] is True and info["status"] == "complete"
    assert info["torch"] and info["plan"]["num_points"] == len(plan)
    assert info["run"]["by_status"] == {"measured": len(plan)} and info["run"]["wall_s"] > 0


def test_calibrate_accepts_a_dry_run_directory_only_when_asked(dry_run: tuple[Path, list[dict[str, str]]],
                                                               tmp_path: Path) -> None:
    out, _ = dry_run
    cal = tmp_path / "cal.json"
    assert main(["calibrate", "--hardware", "h100_sxm", "--microbench", str(out), "--out", str(cal)]) == 2
    assert not cal.exists()
    assert main(["calibrate", "--hardware", "h100_sxm", "--microbench", str(out), "--out", str(cal),
                 "--allow-dry-run"]) == 0
    art = load_artifact(cal)
    assert art.tier == "target-measured" and art.hardware == "h100_sxm"
    corrected = {f for f, p in art.families.items() if p.correction is not None}
    assert {"gemm", "attn_prefill", "attn_decode", "nccl", "pointwise"} <= corrected


def test_refuses_to_measure_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch", reason="the no-torch refusal is tested in a subprocess below")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    write_plan(tmp_path / "plan.csv", step=50)
    out = tmp_path / "out"
    assert main(["microbench", "run", "--plan", str(tmp_path / "plan.csv"), "--out", str(out)]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err
    assert main(["microbench", "run", "--plan", str(tmp_path / "plan.csv"), "--out", str(out),
                 "--device", "cpu"]) == 2
    assert "--device cpu needs --dry-run" in capsys.readouterr().err
    assert not out.exists()


def test_resume_keeps_measured_points(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    write_plan(tmp_path / "plan.csv", step=40)
    out = tmp_path / "out"
    args = ["microbench", "run", "--plan", str(tmp_path / "plan.csv"), "--out", str(out), "--device", "cpu",
            "--dry-run"]
    assert main([*args, "--only", "gemm"]) == 0
    assert {p.name for p in out.iterdir()} == {"gemm.csv.gz", "points.csv", "device.json"}
    gemm_before = read_table(out / "gemm.csv.gz")[1]
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err
    # mark the first GEMM point as skipped: resume must retry it, and keep the others as they were
    with (out / "points.csv").open() as f:
        reader = csv.DictReader(f)
        header, points = list(reader.fieldnames or []), list(reader)
    points[0].update(status="skipped", reason="test", latency_ms="", p10_ms="", p90_ms="")
    with (out / "points.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(points)
    assert main([*args, "--resume"]) == 0
    gemm_after = read_table(out / "gemm.csv.gz")[1]
    assert len(gemm_after) == len(gemm_before) and gemm_after[1:] == gemm_before[1:]
    info = json.loads((out / "device.json").read_text())
    assert info["run"]["points_resumed"] == len(gemm_before) - 1
    with (out / "points.csv").open() as f:
        keys = [p["key"] for p in csv.DictReader(f)]
    assert len(keys) == len(set(keys))


def test_resume_refuses_another_plan_or_mode_and_keeps_every_runs_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before 2026-12-02 resuming with another plan deleted the first plan's tables (rc 0), and a dry
    run resumed into a GPU run's directory mixed its meaningless times into the tables."""
    pytest.importorskip("torch")
    write_plan(tmp_path / "plan.csv", step=40)
    write_plan(tmp_path / "other.csv", step=41)
    out = tmp_path / "out"
    args = ["microbench", "run", "--out", str(out), "--device", "cpu", "--dry-run", "--only", "gemm"]
    assert main([*args, "--plan", str(tmp_path / "plan.csv")]) == 0
    gemm_before = read_table(out / "gemm.csv.gz")[1]
    assert main([*args, "--plan", str(tmp_path / "other.csv"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--plan" in err and "another plan" in err
    assert read_table(out / "gemm.csv.gz")[1] == gemm_before  # nothing lost
    info = json.loads((out / "device.json").read_text())
    (out / "device.json").write_text(json.dumps({**info, "dry_run": False}))
    assert main([*args, "--plan", str(tmp_path / "plan.csv"), "--resume"]) == 2
    assert "GPU run's points" in capsys.readouterr().err
    (out / "device.json").write_text(json.dumps(info))
    assert main([*args, "--plan", str(tmp_path / "plan.csv"), "--resume"]) == 0
    resumed = json.loads((out / "device.json").read_text())
    assert [r["date_utc"] for r in resumed["earlier_runs"]] == [info["date_utc"]]
    assert resumed["earlier_runs"][0]["run"] == info["run"]


def test_a_resume_is_checked_against_the_directorys_device_record(tmp_path: Path) -> None:
    """The same checks without torch: plan, mode and GPU of `device.json` against the resuming run."""
    from orchestrator.microbench.points import read_plan
    from orchestrator.microbench.runner import RunOptions, _earlier_run
    from sim.errors import ConfigError

    write_plan(tmp_path / "plan.csv", step=40)
    write_plan(tmp_path / "other.csv", step=41)
    plan, other = read_plan(tmp_path / "plan.csv"), read_plan(tmp_path / "other.csv")
    out = tmp_path / "out"
    out.mkdir()
    record = {"plan": {"sha256": plan.sha256, "path": "plan.csv"}, "dry_run": False,
              "gpu": {"uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3"}, "date_utc": "2026-11-28T06:23:11+00:00"}
    (out / "device.json").write_text(json.dumps(record))
    opts = RunOptions(plan=tmp_path / "plan.csv", out=out, resume=True)
    here = {"gpu": {"uuid": "GPU-1"}}
    assert _earlier_run(opts, plan, here) == record
    assert _earlier_run(RunOptions(plan=tmp_path / "plan.csv", out=out), plan, here) is None  # not resuming
    for bad, run_info, key in ((RunOptions(plan=tmp_path / "other.csv", out=out, resume=True), here, "--plan"),
                               (RunOptions(plan=tmp_path / "plan.csv", out=out, resume=True, dry_run=True), here,
                                "--dry-run"),
                               (opts, {"gpu": {"uuid": "GPU-2"}}, "--device")):
        with pytest.raises(ConfigError) as exc:
            _earlier_run(bad, other if bad.plan.name == "other.csv" else plan, run_info)
        assert exc.value.key == key


def test_calibrate_refuses_a_dry_run_or_another_gpus_tables(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Before 2026-12-02 `calibrate` read no `device.json`: a dry run's tables calibrated with rc 0
    (fp8 4096^3 GEMM 0.139 -> 0.069 ms) and `--hardware l4` took H100 tables."""
    tables = tmp_path / "tables"
    tables.mkdir()
    for name in ("gemm.csv.xz",):
        (tables / name).write_bytes((H100_TABLES / name).read_bytes())
    cal = tmp_path / "cal.json"
    args = ["calibrate", "--hardware", "h100_sxm", "--microbench", str(tables), "--out", str(cal)]
    (tables / "device.json").write_text(json.dumps({"dry_run": True, "hardware": "h100_sxm"}))
    assert main(args) == 2 and "dry run" in capsys.readouterr().err and not cal.exists()
    (tables / "device.json").write_text(json.dumps({"dry_run": False, "hardware": "h100_sxm"}))
    assert main([*args[:2], "l4", *args[3:]]) == 2
    assert "measured on h100_sxm" in capsys.readouterr().err
    assert main([*args[:-1], str(tmp_path)]) == 2  # --out a directory: refused before the fit
    assert "is a directory" in capsys.readouterr().err
    assert main(args) == 0 and cal.is_file()
    assert not list(tmp_path.glob("*.tmp"))


def test_malformed_plan_names_row_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.csv"
    plan.write_text(",".join(ROW_COLUMNS) + "\n" + "gemm,,,,bfloat16,0,128,128" + "," * (len(ROW_COLUMNS) - 8) + "\n")
    assert main(["microbench", "run", "--plan", str(plan), "--out", str(tmp_path / "o"), "--device", "cpu",
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "row 1" in err and "m=" in err


def _run_without_torch(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return cli_without(("torch",), argv, tmp_path)


def test_dry_run_without_torch_writes_the_same_layout(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.csv", step=20)
    out = tmp_path / "out"
    done = _run_without_torch(["microbench", "run", "--plan", "plan.csv", "--out", str(out), "--device", "cpu",
                               "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stderr
    for name in {FILE_OF[f] for r in plan if (f := family_of(r["kernel"])) in FILE_OF}:
        header, rows = read_table(out / name)
        assert tuple(header) == TABLE_COLUMNS[name] and rows
        assert all(float(r["latency_ms"]) > 0 for r in rows)
    # MoE / MLA / DeepEP points are skipped with a reason naming the library they need.
    with (out / "points.csv").open(newline="") as pf:
        table_points = [r for r in csv.DictReader(pf) if r["kernel"] in ("moe", "mla_generation", "deepep_ll")]
    assert table_points and all(r["status"] == "skipped" for r in table_points)
    reasons = " ".join(r["reason"] for r in table_points)
    assert "vLLM's fused_moe Triton kernel" in reasons and "not installed" in reasons and "FlashMLA" in reasons
    info = json.loads((out / "device.json").read_text())
    assert info["torch"] is None and info["dry_run"] is True
    refused = _run_without_torch(["microbench", "run", "--plan", "plan.csv", "--out", str(tmp_path / "o2")],
                                 tmp_path)
    assert refused.returncode == 2
    assert "needs PyTorch" in refused.stderr and "kernelsight[microbench]" in refused.stderr


def test_compare_dry_run_against_the_real_h100_tables(dry_run: tuple[Path, list[dict[str, str]]],
                                                      tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    out, _ = dry_run
    report = tmp_path / "report.md"
    assert main(["microbench", "compare", "--ours", str(out), "--theirs", str(H100_TABLES), "--out", str(report)]) == 0
    text = report.read_text()
    assert "dry run: times are meaningless" in text
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
             if line.startswith("| ") and not line.startswith("| family")]
    matched = {(r[0], r[1]): int(r[2]) for r in table}
    assert {f for f, _ in matched} >= {"gemm", "attn_prefill", "attn_decode", "nccl", "custom_allreduce"}
    assert matched[("gemm", "sglang 0.5.10 sglang")] > 0
    assert all(n > 0 for n in matched.values())


def test_plans_that_are_not_utf8_repeat_a_column_or_overflow_a_row_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before 2026-12-02: a traceback (rc 1) for a binary file; a second `dtype` column silently won
    (a bfloat16 row measured as fp8); extra cells were dropped; `--device cuda:x` raised a ValueError."""
    cases = {"binary.csv": (b"kernel,dtype\n\xff\xfe,x\n", "not UTF-8"),
             "repeated.csv": (b"kernel,dtype,dtype,m,n,k\ngemm,bfloat16,fp8,16,128,128\n", "more than once"),
             "long.csv": (b"kernel,dtype,m,n,k\ngemm,bfloat16,16,128,128,9\n", "more cells than")}
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert main(["microbench", "run", "--plan", str(tmp_path / name), "--out", str(tmp_path / f"o-{name}"),
                     "--device", "cpu", "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert main(["microbench", "run", "--plan", str(tmp_path / "long.csv"), "--out", str(tmp_path / "o"),
                 "--device", "cuda:x"]) == 2
    assert "must be cuda[:N]" in capsys.readouterr().err


@pytest.mark.parametrize("cell", ["0", "-16", "16.5", "1e13"])
def test_calibrate_refuses_a_size_that_is_no_size(tmp_path: Path, cell: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before 2026-12-02 `calibrate` fitted on a GEMM row with m = 0, -16, 16.5 or 1e12 (rc 0)."""
    with open_text(H100_TABLES / "gemm.csv.xz") as f:
        lines = f.read().splitlines()
    header = lines[0].split(",")
    row = lines[1].split(",")
    row[header.index("m")] = cell
    (tmp_path / "gemm.csv").write_text("\n".join([lines[0], ",".join(row), *lines[2:50]]) + "\n")
    assert main(["calibrate", "--hardware", "h100_sxm", "--microbench", str(tmp_path), "--out",
                 str(tmp_path / "cal.json"), "--no-bridge"]) == 2
    err = capsys.readouterr().err
    assert "row 1" in err and "m=" in err and "whole number" in err
