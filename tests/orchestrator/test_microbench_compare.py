"""`kernelsight microbench compare`: ratios on hand-built tables (the join against a real table is in
test_microbench_run.py, on its dry run)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from orchestrator.microbench.compare import compare_dirs, render_markdown

pytest.importorskip("pandas", reason="compare reads tables with pandas (calibrate extra)")

GEMM_HEADER = "backend,backend_version,kernel_source,dtype,m,n,k,latency_ms\n"
NCCL_HEADER = "nccl_version,nccl_version_reported,op,nccl_dtype,num_gpus,message_elems,latency_ms\n"


def write(path: Path, text: str) -> None:
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def test_ratios_by_hand(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "h100_sxm"
    ours.mkdir()
    theirs.mkdir()
    write(ours / "gemm.csv.gz", GEMM_HEADER + "torch,2.6,torch_matmul,bfloat16,1,1024,1024,0.02\n"
                                              "torch,2.6,torch_matmul,bfloat16,16,1024,1024,0.04\n"
                                              "torch,2.6,torch_matmul,bfloat16,64,1024,1024,0.09\n")
    write(theirs / "gemm.csv.gz", GEMM_HEADER + "sglang,0.5.10,sglang,bfloat16,1,1024,1024,0.01\n"
                                                "sglang,0.5.10,sglang,bfloat16,16,1024,1024,0.01\n"
                                                "sglang,0.5.10,sglang,bfloat16,64,1024,1024,0.03\n"
                                                "vllm,0.14.0,vllm_default,bfloat16,1,1024,1024,0.04\n"
                                                "vllm,0.14.0,vllm_default,fp8,1,1024,1024,0.001\n"
                                                "sglang,0.5.10,sglang,bfloat16,2,1024,1024,0.01\n")
    write(ours / "nccl.csv", NCCL_HEADER + "2.21.5,2.21.5,all_reduce,half,8,2048,0.03\n")
    write(theirs / "nccl.csv", NCCL_HEADER + "2.27.3,,all_reduce,half,8,2048,0.02\n"
                                             "2.27.3,,all_reduce,half,8,2048,0.04\n"
                                             "2.27.3,,all_reduce,half,4,2048,0.5\n")
    got = {(c.family, c.series): c for c in compare_dirs(ours, theirs)}
    assert set(got) == {("gemm", "sglang 0.5.10 sglang"), ("gemm", "vllm 0.14.0 vllm_default"),
                        ("nccl", "nccl 2.27.3")}
    sg = got[("gemm", "sglang 0.5.10 sglang")]
    assert sg.num_matched == 3 and sg.median_ratio == pytest.approx(3.0)  # ratios 2, 4, 3
    assert sg.p10_ratio == pytest.approx(2.2) and sg.p90_ratio == pytest.approx(3.8)
    assert sg.ours == "torch_matmul"
    assert got[("gemm", "vllm 0.14.0 vllm_default")].median_ratio == pytest.approx(0.5)
    nccl = got[("nccl", "nccl 2.27.3")]
    assert nccl.num_matched == 1 and nccl.median_ratio == pytest.approx(1.0)  # theirs: median of two runs
    md = render_markdown(list(got.values()), ours, theirs)
    assert "| gemm | sglang 0.5.10 sglang | 3 | 3.000 | 2.200 | 3.800 | torch_matmul |" in md
