"""Property: whatever bytes a user hands the CLI, it exits 0 or 2 and never with a traceback.

Random bytes and mutations (a value swapped for an odd literal, a key renamed, a line dropped or
doubled, bytes spliced in, the file cut short) of the shipped scenarios, sweeps and hardware specs
go to `check`, `run` (a few requests), `step`; random kernel-row CSVs to `predict-kernels`. `sweep`
itself starts Ray and is left out; its file parsing runs through `check`. Derandomized, so every
run draws the same examples.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path

from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from sim.calibration.rows import ROW_COLUMNS

SCENARIOS = {p.name: p.read_text() for p in sorted((REPO / "scenarios").glob("*.toml"))}
SWEEPS = {p.name: p.read_text() for p in sorted((REPO / "sweeps").glob("*.toml"))}
HARDWARE = {p.name: p.read_text() for p in sorted((REPO / "sim/data/hardware").glob("*.toml"))
            if p.stem in ("h100_sxm", "a100_sxm", "l4", "gb200")}
LITERALS = ("-1", "0", "1", "1e30", "-1e30", "inf", "-inf", "nan", '"x"', '""', "true", "[]", "{}",
            "1000000000000", "9223372036854775807", "0.5", '"h100_sxm"', '"../nope.toml"', '"x.json"',
            "[1, 2]", "{ a = 1 }", '"trace"', '"random"', '"cross-generation"', "3000000000", "-0.0")
CELLS = ("", "1", "8", "128", "4096", "0", "-1", "1.5", "nan", "inf", "-inf", "1e30", "2147483648", "abc",
         "gemm", "context_attention", "generation_attention", "nccl_all_reduce", "norm", "sampling",
         "bf16", "fp8", "bfloat16", "nvfp4", '"8"', "1e3")
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_ASSIGNMENT = re.compile(r"^(\s*[\"\w.-]+\s*=\s*)(.*)$")


@st.composite
def mutated(draw: st.DrawFn, texts: dict[str, str]) -> tuple[str, bytes]:
    """(origin file name, bytes): random bytes, or an origin file with one to three mutations."""
    name = draw(st.sampled_from(sorted(texts)))
    if draw(st.integers(0, 9)) == 0:
        return name, draw(st.binary(max_size=300))
    lines = texts[name].splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(("value", "value", "value", "key", "drop", "double", "splice", "cut")))
        match = _ASSIGNMENT.match(lines[i])
        if op == "value" and match:
            lines[i] = match.group(1) + draw(st.sampled_from(LITERALS))
        elif op == "key" and match:
            lines[i] = "bogus_" + lines[i].lstrip()
        elif op == "drop":
            del lines[i]
        elif op == "double":
            lines.insert(i, lines[i])
        if not lines:
            lines = [""]
    data = "\n".join(lines).encode()
    if draw(st.booleans()) and draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    if draw(st.integers(0, 7)) == 0:
        data = data[:draw(st.integers(0, len(data)))]
    return name, data


def run_cli(argv: list[str]) -> tuple[int, str]:
    """Exit code and stderr of one in-process CLI call; an uncaught exception fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def assert_clean(argv: list[str]) -> None:
    code, err = run_cli(argv)
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert err.startswith("error"), err


def workspace(tmp: str) -> Path:
    """A copy of the repo's scenarios/ and sweeps/, so relative paths inside files resolve as shipped."""
    root = Path(tmp)
    for folder, texts in (("scenarios", SCENARIOS), ("sweeps", SWEEPS)):
        (root / folder).mkdir()
        for name, text in texts.items():
            (root / folder / name).write_text(text)
    return root


@SETTINGS
@given(case=mutated(SCENARIOS))
def test_scenario_files(case: tuple[str, bytes]) -> None:
    name, data = case
    with tempfile.TemporaryDirectory() as tmp:
        path = workspace(tmp) / "scenarios" / f"fuzz-{name}"
        path.write_bytes(data)
        assert_clean(["check", str(path)])
        assert_clean(["step", str(path), "--prefill", "256", "--decode", "4x128"])
        # A few short requests keep a run fast whatever the file asks for.
        assert_clean(["run", str(path), "--set", "workload.num_prompts=3", "--set", "workload.random_output_len=8"])


@SETTINGS
@given(case=mutated(SWEEPS))
def test_sweep_files(case: tuple[str, bytes]) -> None:
    name, data = case
    with tempfile.TemporaryDirectory() as tmp:
        path = workspace(tmp) / "sweeps" / f"fuzz-{name}"
        path.write_bytes(data)
        assert_clean(["check", str(path)])


@SETTINGS
@given(case=mutated(HARDWARE))
def test_hardware_files(case: tuple[str, bytes]) -> None:
    _, data = case
    with tempfile.TemporaryDirectory() as tmp:
        root = workspace(tmp)
        (root / "hw.toml").write_bytes(data)
        scenario = root / "s.toml"
        scenario.write_text(SCENARIOS["llama3_8b-h100.toml"].replace('"h100_sxm"', '"hw.toml"'))
        assert_clean(["check", str(root / "hw.toml")])
        assert_clean(["step", str(scenario), "--decode", "4x128", "--set", "perf.tier=roofline"])


@st.composite
def kernel_rows(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    columns = ["kernel", *draw(st.lists(st.sampled_from(ROW_COLUMNS[1:]), max_size=8, unique=True))]
    columns = draw(st.permutations(columns))
    lines = [",".join(columns)]
    for _ in range(draw(st.integers(0, 4))):
        lines.append(",".join(draw(st.sampled_from(CELLS)) for _ in columns))
    return ("\n".join(lines) + "\n").encode()


@SETTINGS
@given(data=kernel_rows(), tier=st.sampled_from(("roofline", "cross-generation")))
def test_kernel_rows(data: bytes, tier: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "rows.csv"
        src.write_bytes(data)
        assert_clean(["predict-kernels", "--hardware", "h100_sxm", "--tier", tier, "--in", str(src),
                      "--out", str(Path(tmp) / "pred.csv")])
