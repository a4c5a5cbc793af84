"""Bad input on the command line: one `error: ...` line naming file, key, value and rule, exit 2.

Each case builds its files under tmp_path and runs the CLI in-process; the message must hold the
listed fragments and no traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO

from orchestrator.cli import main

SCENARIO = (REPO / "scenarios/llama3_8b-h100.toml").read_text()
MODEL_CONFIG = REPO / "sim/data/models"
GOOD_ROWS = "kernel,dtype,m,n,k\ngemm,bf16,128,4096,4096\n"


def scenario(tmp: Path, edit: Callable[[str], str] = lambda t: t, name: str = "s.toml") -> str:
    path = tmp / name
    path.write_text(edit(SCENARIO))
    return str(path)


def llama_config(tmp: Path, **changes: object) -> str:
    """A copy of the shipped Llama-3.1-8B config.json with `changes`, as a scenario on it."""
    index = (MODEL_CONFIG / "index.toml").read_text()
    entry = index[index.index('"meta-llama/Llama-3.1-8B"'):]
    config_name = entry[entry.index("config = ") + 10:].split('"')[0]
    config = json.loads((MODEL_CONFIG / config_name).read_text())
    config.update(changes)
    (tmp / "config.json").write_text(json.dumps(config))
    return scenario(tmp, lambda t: t.replace('"meta-llama/Llama-3.1-8B"', '"config.json"')
                    .replace("max_model_len = 8192", "max_model_len = 4096"))


def rows(tmp: Path, text: str | bytes) -> list[str]:
    path = tmp / "rows.csv"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return ["predict-kernels", "--hardware", "h100_sxm", "--in", str(path), "--out", str(tmp / "pred.csv")]


GEMM_TABLE = ("backend,backend_version,kernel_source,dtype,m,n,k,latency_ms\n"
              + "".join(f"torch,2.11.0,torch_matmul,bfloat16,{m},4096,4096,{0.01 * (i + 1)}\n"
                        for i, m in enumerate((1, 16, 64, 256))))


def microbench(tmp: Path, text: str | bytes, name: str = "gemm.csv") -> list[str]:
    """`calibrate` on a microbenchmark directory holding one table file."""
    d = tmp / "mb"
    d.mkdir(exist_ok=True)
    if isinstance(text, bytes):
        (d / name).write_bytes(text)
    else:
        (d / name).write_text(text)
    return ["calibrate", "--hardware", "h100_sxm", "--microbench", str(d), "--out", str(tmp / "cal.json")]


def first_latency(value: str) -> str:
    """GEMM_TABLE with the first row's latency_ms cell replaced."""
    lines = GEMM_TABLE.splitlines(keepends=True)
    lines[1] = lines[1].rsplit(",", 1)[0] + f",{value}\n"
    return "".join(lines)


def nan_calibration(tmp: Path) -> str:
    """The shipped H100 calibration with one NaN coefficient (what a fit on an inf latency wrote)."""
    data = json.loads((REPO / "sim/data/calibration/h100_sxm.json").read_text())
    next(iter(data["families"].values()))["coef"][0] = float("nan")
    (tmp / "nan.json").write_text(json.dumps(data))
    return str(tmp / "nan.json")


def with_trace(tmp: Path, trace: str) -> str:
    (tmp / "trace.csv").write_text(trace)
    return scenario(tmp, lambda t: t.replace("num_prompts = 1000", "num_prompts = 2").replace(
        "random_input_len = 1024", 'dataset_name = "trace"\ndataset_path = "trace.csv"'))


def _bytes_file(tmp: Path, data: bytes, name: str = "bad.toml") -> str:
    (tmp / name).write_bytes(data)
    return str(tmp / name)


def _dir(path: Path) -> Path:
    path.mkdir()
    return path


# (case id, argv builder, fragments the error line must contain)
CASES: list[tuple[str, Callable[[Path], list[str]], tuple[str, ...]]] = [
    # Files that are not UTF-8 text.
    ("binary toml", lambda t: ["check", _bytes_file(t, b"\x00\xff\xfe\x89PNG\x00")],
     ("bad.toml", "not UTF-8", "TOML files must be UTF-8")),
    ("latin-1 toml", lambda t: ["check", _bytes_file(t, SCENARIO.replace("# Llama", "# Llamé").encode("latin-1"))],
     ("bad.toml", "not UTF-8")),
    ("utf-16 toml", lambda t: ["run", _bytes_file(t, SCENARIO.encode("utf-16"))], ("bad.toml", "not UTF-8")),
    ("utf-16 sweep", lambda t: ["sweep", _bytes_file(t, (REPO / "sweeps/quickstart.toml").read_text()
                                                     .encode("utf-16"), "sw.toml")], ("sw.toml", "not UTF-8")),
    ("invalid toml", lambda t: ["step", _bytes_file(t, b"seed = = 1"), "--decode", "1x8"],
     ("bad.toml", "invalid TOML")),
    # Field rules.
    ("negative seed", lambda t: ["check", scenario(t, lambda s: s.replace("seed = 0", "seed = -1"))],
     ("s.toml", "seed=-1", "must be >= 0")),
    ("num_prompts 1e12", lambda t: ["run", scenario(t, lambda s: s.replace("num_prompts = 1000",
                                                                          "num_prompts = 1000000000000"))],
     ("s.toml", "workload.num_prompts=1000000000000", "10,000,000")),
    ("num_prompts billions", lambda t: ["check", scenario(t, lambda s: s.replace("num_prompts = 1000",
                                                                                "num_prompts = 3000000000"))],
     ("workload.num_prompts=3000000000", "must be in [1, 10,000,000]")),
    ("infinite API-server latency", lambda t: ["check", scenario(t, lambda s: s.replace(
        "[engine]", "[engine]\napi_server_latency_s = inf"))],
     ("s.toml", "engine.api_server_latency_s=inf", "must be a finite number >= 0")),
    ("infinite mamba_full_memory_ratio", lambda t: ["check", scenario(t, lambda s: s.replace(
        "[engine]", "[engine]\nmamba_full_memory_ratio = inf").replace(
        '"meta-llama/Llama-3.1-8B"', '"Qwen/Qwen3.5-397B-A17B"').replace('name = "h100_sxm"', 'name = "h200_sxm"'))],
     ("s.toml", "engine.mamba_full_memory_ratio=inf", "must be in (0, 1e+06]")),
    ("negative attention window", lambda t: ["check", scenario(t, lambda s: s.replace(
        "[engine]", "[engine]\nmax_attention_window = -1"))],
     ("s.toml", "engine.max_attention_window=-1", "must be >= 0")),
    ("trtllm budget below a block", lambda t: ["check", scenario(t, lambda s: s.replace(
        "[engine]", '[engine]\nbackend = "trtllm"\nblock_size = 32\nmax_num_batched_tokens = 16\nmax_num_seqs = 8'))],
     ("s.toml", "engine.max_num_batched_tokens=16", "must be at least block_size (32)")),
    ("missing calibration", lambda t: ["check", scenario(t, lambda s: s + '\n[perf]\ncalibration = "nope.json"\n')],
     ("s.toml", "perf.calibration='nope.json'", "file not found")),
    ("missing dataset", lambda t: ["check", scenario(t, lambda s: s.replace(
        "random_input_len = 1024", 'dataset_name = "trace"\ndataset_path = "nope.csv"'))],
     ("s.toml", "workload.dataset_path='nope.csv'", "file not found")),
    ("negative trace timestamp", lambda t: ["check", with_trace(t, "input_tokens,output_tokens,arrival_s\n"
                                                                  "100,10,-5\n100,10,-4\n")],
     ("trace.csv row 1", "arrival_s=-5.0", "must be a finite number >= 0")),
    ("dataset_path with random", lambda t: ["check", scenario(t, lambda s: s.replace(
        "random_input_len = 1024", 'dataset_path = "s.toml"\nrandom_input_len = 1024'))],
     ("s.toml", "workload.dataset_path=", "not 'random'")),
    # config.json rules name the config key.
    ("zero heads", lambda t: ["check", llama_config(t, num_attention_heads=0)],
     ("config.json", "num_attention_heads=0", "must be > 0")),
    ("zero kv heads", lambda t: ["check", llama_config(t, num_key_value_heads=0)],
     ("config.json", "num_key_value_heads=0", "must be > 0")),
    ("heads not divisible", lambda t: ["check", llama_config(t, num_attention_heads=33, num_key_value_heads=8)],
     ("config.json", "num_key_value_heads=8", "must divide num_attention_heads=33")),
    ("zero max_position_embeddings", lambda t: ["step", llama_config(t, max_position_embeddings=0), "--decode", "1x8"],
     ("config.json", "max_position_embeddings=0", "must be > 0")),
    ("zero layers", lambda t: ["check", llama_config(t, num_hidden_layers=0)],
     ("config.json", "num_hidden_layers=0", "must be > 0")),
    ("binary config.json", lambda t: ["check", scenario(t, lambda s: s.replace(
        '"meta-llama/Llama-3.1-8B"', f'"{_bytes_file(t, bytes(range(256)), "m.json")}"'))],
     ("m.json", "not UTF-8", "JSON files must be UTF-8")),
    # predict-kernels rows.
    ("nan cell", lambda t: rows(t, "kernel,dtype,m,n,k\ngemm,bf16,nan,4096,4096\n"),
     ("rows.csv row 1", "m='nan'", "must be an integer >= 1")),
    ("inf in optional cell", lambda t: rows(t, "kernel,batch_size,seq_len,num_heads,head_dim,window_size\n"
                                               "context_attention,1,128,8,128,inf\n"),
     ("rows.csv row 1", "window_size='inf'", "must be an integer")),
    ("m = 1e30", lambda t: rows(t, "kernel,dtype,m,n,k\ngemm,bf16,1e30,4096,4096\n"),
     ("rows.csv row 1", "m='1e30'", "<= 2147483647")),
    ("huge attention batch", lambda t: rows(t, "kernel,batch_size,kv_len,num_heads,head_dim\n"
                                               "generation_attention,2000000000,8,8,128\n"),
     ("rows.csv row 1", "batch_size=", "<= 1048576")),
    # Text levels of table-keyed rows: the fast (Arrow) reader priced them as a default before.
    ("unknown MLA kv_cache_dtype", lambda t: rows(t, "kernel,num_heads,batch_size,seq_len,kv_cache_dtype\n"
                                                     "mla_context,16,1,1024,int3\n"),
     ("rows.csv row 1", "kv_cache_dtype='int3'", "must be bfloat16 or fp8")),
    ("unknown mla_bmm op_name", lambda t: rows(t, "kernel,op_name,bmm_dtype,num_tokens,num_heads\n"
                                                  "mla_bmm,mla_gen_typo,bfloat16,16,16\n"),
     ("rows.csv row 1", "op_name='mla_gen_typo'", "must be one of mla_gen_pre, mla_gen_post")),
    ("unknown gemm_type", lambda t: rows(t, "kernel,num_heads,batch_size,seq_len,gemm_type\n"
                                            "mla_module_context,16,1,1024,int3\n"),
     ("rows.csv row 1", "gemm_type='int3'", "must be one of")),
    ("binary csv", lambda t: rows(t, b"kernel,dtype,m\n\xff\xfe\x00\x01gemm\n"),
     ("rows.csv", "not UTF-8", "CSV files must be UTF-8")),
    ("nul in csv", lambda t: rows(t, b"kernel,dtype,m,n,k\ngemm,bf16,1\x00,2,3\n"), ("rows.csv",)),
    ("missing rows file", lambda t: ["predict-kernels", "--hardware", "h100_sxm", "--in", str(t / "nope.csv"),
                                     "--out", str(t / "p.csv")], ("nope.csv", "--in=", "file not found")),
    ("rows file is a directory", lambda t: ["predict-kernels", "--hardware", "h100_sxm", "--in", str(t),
                                            "--out", str(t / "p.csv")], ("--in=", "is a directory")),
    ("out is a directory", lambda t: [*rows(t, GOOD_ROWS)[:-1], str(t)], ("--out=", "is a directory")),
    ("out under a file", lambda t: [*rows(t, GOOD_ROWS)[:-1], str(t / "rows.csv" / "p.csv")],
     ("--out=", "cannot be written")),
    ("missing calibration flag", lambda t: [*rows(t, GOOD_ROWS), "--tier", "target-measured",
                                            "--calibration", str(t / "cal.json")], ("cal.json", "file not found")),
    ("short row", lambda t: rows(t, "kernel,dtype,m,n,k,variant\ngemm,bf16,128,4096,4096\n"),
     ("rows.csv row 1", "has 5 fields, the header has 6")),
    ("long row", lambda t: rows(t, "kernel,dtype,m,n,k\ngemm,bf16,128,4096,4096\ngemm,bf16,128,4096,4096,x\n"),
     ("rows.csv row 2", "has 6 fields, the header has 5")),
    ("duplicated column", lambda t: rows(t, "kernel,dtype,m,n,k,m\ngemm,bf16,128,4096,4096,1\n"),
     ("rows.csv", "m='m'", "column appears twice")),
    *[(f"routing {alpha}", lambda t, alpha=alpha: rows(
        t, "kernel,moe_dtype,num_tokens,hidden_size,inter_size,topk,num_experts,moe_tp_size,moe_ep_size,distribution\n"
           f"moe,bfloat16,128,4096,14336,2,8,1,1,power_law_{alpha}\n"),
       ("rows.csv row 1", f"distribution='power_law_{alpha}'", "alpha >= 0"))
      for alpha in ("nan", "-3", "inf")],
    ("topk over the experts", lambda t: rows(
        t, "kernel,moe_dtype,num_tokens,hidden_size,inter_size,topk,num_experts,moe_tp_size,moe_ep_size,distribution\n"
           "moe,bfloat16,128,4096,14336,16,8,1,1,balanced\n"),
     ("rows.csv row 1", "topk='16'", "must be <= num_experts=8")),
    ("NaN calibration", lambda t: [*rows(t, GOOD_ROWS), "--tier", "target-measured", "--calibration",
                                   nan_calibration(t)], ("nan.json", "coef=nan", "must be finite")),
    # calibrate tables.
    *[(f"latency {value!r}", lambda t, value=value: microbench(t, first_latency(value)),
       ("gemm.csv row 1", "latency_ms=", "must be a finite number of milliseconds > 0"))
      for value in ("inf", "nan", "-1", "0", "")],
    ("text latency", lambda t: microbench(t, first_latency("abc")),
     ("gemm.csv row 1", "latency_ms='abc'", "must be a number")),
    ("text size", lambda t: microbench(t, GEMM_TABLE.replace(",16,", ",x,")),
     ("gemm.csv row 2", "m='x'", "must be a number")),
    ("no latency column", lambda t: microbench(t, GEMM_TABLE.replace(",latency_ms", "")),
     ("gemm.csv", "latency_ms=None", "column is required")),
    ("empty table", lambda t: microbench(t, ""), ("gemm.csv", "empty file")),
    ("corrupt gzip table", lambda t: microbench(t, b"not gzip", "gemm.csv.gz"),
     ("gemm.csv.gz", "corrupt or truncated compressed file")),
    # step batches.
    ("prefill over max_model_len", lambda t: ["step", scenario(t), "--prefill", "100000"],
     ("s.toml", "--prefill=100000", "exceeds engine.max_model_len=8192")),
    ("prefill with cache over max_model_len", lambda t: ["step", scenario(t), "--prefill", "4096:8000"],
     ("--prefill", "12096 tokens", "max_model_len=8192")),
    ("decode over max_model_len", lambda t: ["step", scenario(t), "--decode", "2x8192"],
     ("--decode=8192", "max_model_len=8192")),
    ("decode without COUNTx", lambda t: ["step", scenario(t), "--decode", "64"],
     ("--decode='64'", "must be COUNTxCONTEXT")),
    ("huge step count", lambda t: ["step", scenario(t), "--decode", "100000000x8"], ("--decode", "COUNT must be")),
    # sweep flags, before Ray starts.
    ("sweep storage scheme", lambda t: ["sweep", str(REPO / "sweeps/quickstart.toml"), "--storage", "foo://x",
                                        "--study-dir", str(t / "study")],
     ("--storage='foo://x'", "sqlite:///", "postgresql://")),
    # OS errors and the command line.
    ("missing scenario", lambda t: ["run", str(t / "nope.toml")], ("nope.toml", "file not found")),
    ("scenario is a directory", lambda t: ["step", str(t), "--decode", "1x8"], ("<file>=", "is a directory")),
    ("missing sweep", lambda t: ["sweep", str(t / "nope.toml")], ("nope.toml", "file not found")),
    ("run --out is a file", lambda t: ["run", scenario(t), "--out", scenario(t, name="f.toml")],
     ("f.toml", "--out=", "is a file")),
    ("run --out under a file", lambda t: ["run", scenario(t), "--out", str(t / "s.toml" / "out")],
     ("--out=", "cannot be written")),
    ("dataset is a directory", lambda t: ["check", scenario(t, lambda s: s.replace(
        "random_input_len = 1024", f'dataset_name = "trace"\ndataset_path = "{_dir(t / "d.csv")}"'))], ("d.csv", "is a directory")),
    ("unknown verb", lambda t: ["bogus"], ("kernelsight", "invalid choice: 'bogus'", "--help")),
    ("missing flag", lambda t: ["predict-kernels", "--hardware", "h100_sxm"],
     ("kernelsight predict-kernels", "required: --in, --out")),
    ("bad choice", lambda t: [*rows(t, GOOD_ROWS), "--tier", "foo"], ("argument --tier", "invalid choice: 'foo'")),
    ("bad int flag", lambda t: ["sweep", "x.toml", "--trials", "ten"], ("kernelsight sweep", "--trials", "'ten'")),
    ("unknown flag", lambda t: ["check", "x.toml", "--frobnicate", "a=1"], ("unrecognized arguments: --frobnicate a=1",)),
]


@pytest.mark.parametrize(("argv", "fragments"), [pytest.param(a, f, id=i) for i, a, f in CASES])
def test_bad_input_is_one_clear_error(argv: Callable[[Path], list[str]], fragments: tuple[str, ...],
                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_clear_error(argv, fragments, tmp_path, capsys)


def assert_one_clear_error(argv: Callable[[Path], list[str]], fragments: tuple[str, ...], tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI on `argv(tmp_path)`, run from tmp_path, exits 2 with one error line holding `fragments`."""
    cwd = os.getcwd()
    os.chdir(tmp_path)  # relative paths in the cases resolve inside tmp_path
    try:
        code = main(argv(tmp_path))
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("error: "), err  # the contract: `error: <file>: <key>=<value>: <rule>`
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_failed_predictions_leave_no_partial_file(tmp_path: Path) -> None:
    out = tmp_path / "pred.csv"
    assert main(rows(tmp_path, "kernel,dtype,m,n,k\ngemm,bf16,nan,4096,4096\n")) == 2
    assert not out.exists() and not (tmp_path / "pred.csv.tmp").exists()


def test_step_at_max_model_len_is_accepted(tmp_path: Path) -> None:
    """The bound is inclusive: 8192 cached-plus-new tokens, or 8191 cached plus one sampled."""
    s = scenario(tmp_path)
    assert main(["step", s, "--prefill", "4096:4096", "--decode", "1x8191", "--set", "perf.tier=roofline"]) == 0
