"""Command-line contracts of docs/cli.md: a bad command line names its verb, and output files
(`calibrate --out`, `microbench plan --out`) are checked before the work and named by their flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
MICROBENCH = next((REPO / "sim/data/microbench/h100_sxm").iterdir())


@pytest.mark.parametrize(("argv", "prog"), [
    (["run", "x.toml", "--bogus"], "kernelsight run"),
    (["step", "x.toml", "extra", "--decode", "1x8"], "kernelsight step"),
    (["microbench", "plan", "--hardware", "h100_sxm", "--bogus"], "kernelsight microbench plan"),
    (["predict-kernels", "--hardware", "h100_sxm", "--in", "a", "--out", "b", "--frob", "1"],
     "kernelsight predict-kernels"),
])
def test_unknown_arguments_name_the_verb(argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`error: kernelsight <verb>: <what argparse says> (see kernelsight <verb> --help)`; argparse
    names the top-level parser for unrecognized arguments, so the line said `kernelsight:`."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {prog}: unrecognized arguments: "), err
    assert err.rstrip().endswith(f"(see {prog} --help)"), err


def test_calibrate_out_is_checked_before_the_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An --out that cannot be written fails at once, naming --out (it failed after ~15 s of fitting,
    as `<file>=...: file not found`)."""
    import sim.calibration.calibrate as calibrate

    def no_fit(*args: object, **kwargs: object) -> None:
        raise AssertionError("the fit ran before --out was checked")

    monkeypatch.setattr(calibrate, "calibrate_dir", no_fit)
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "cal.json"
    code = main(["calibrate", "--hardware", "h100_sxm", "--microbench", str(MICROBENCH), "--out", str(out),
                 "--no-bridge"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {out}: --out='{out}': "), err
    assert "a parent of it is a file" in err


def test_microbench_plan_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--out` in a directory that does not exist yet is created (as predict-kernels does); one that
    cannot be written is named as --out ("cannot be written"), not as a missing input file."""
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / "plan.csv"
    assert main(["microbench", "plan", "--hardware", "h100_sxm", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: --out='{bad}': a parent of it is a file"), err
    good = tmp_path / "new" / "plan.csv"
    assert main(["microbench", "plan", "--hardware", "h100_sxm", "--out", str(good)]) == 0
    assert good.read_text().startswith("kernel,")


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow", "row-by-row"])
def test_predict_kernels_skips_blank_lines_on_both_readers(arrow: bool, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A trailing blank line (as editors write) is no row: Arrow's reader skipped it, the row-by-row
    reader (core install without pyarrow, or any row Arrow cannot take) refused it as a row of 0 fields."""
    import orchestrator.commands_kernels as kernels

    if not arrow:
        monkeypatch.setattr(kernels, "_read_fast", lambda src, header: None)
    src, out = tmp_path / "rows.csv", tmp_path / "pred.csv"
    src.write_text("kernel,dtype,m,n,k\ngemm,bf16,128,4096,4096\n\ngemm,bf16,256,4096,4096\n\n")
    assert main(["predict-kernels", "--hardware", "h100_sxm", "--in", str(src), "--out", str(out)]) == 0
    lines = [line for line in out.read_text().splitlines() if line]
    assert len(lines) == 3


def test_predict_kernels_names_the_tier_it_priced_with_after_a_fallback(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """b200_sxm ships no calibration, so target-measured falls back to cross-generation: the closing
    line names the tier the predictions come from (it named the one asked for)."""
    rows = tmp_path / "rows.csv"
    rows.write_text("kernel,dtype,m,n,k\ngemm,bfloat16,128,4096,4096\n")
    out = tmp_path / "pred.csv"
    argv = ["predict-kernels", "--hardware", "b200_sxm", "--tier", "target-measured", "--in", str(rows),
            "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "target-measured falls back to cross-generation" in err
    assert f"wrote 1 predictions (cross-generation) to {out}" in err
