"""The measured data shipped in the package: lookup by upstream name, checksums, provenance."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pandas as pd
import pytest
from conftest import MEASURED_DATA, SHARED_DATA

from sim.calibration.select import CALIBRATION_DIR
from sim.calibration.tables import NEW_TABLE_FILES, TABLE_FILES, file_sha256, read_microbench_dir
from sim.measured import open_text, read_text_bytes, resolve, table_name
from sim.measured.vendor import SYSTEMS, check, load_manifest, vendor
from sim.validation.load import DATA_FILES, data_sha256
from sim.validation.load import data_sha256 as e2e_sha256

UPSTREAM = pytest.mark.skipif(not (SHARED_DATA / "aiconfigurator").is_dir(), reason="no ../shared/data upstream")
NCCL = b"nccl_version,op,nccl_dtype,num_gpus,message_elems,latency_ms\n2.27.3,all_reduce,half,2,256,0.01\n"
GEMM = (b"backend,backend_version,kernel_source,dtype,m,n,k,latency_ms\n"
        b"sglang,0.5.10,sglang,bfloat16,1,4096,4096,0.02\nsglang,0.5.10,sglang,bfloat16,8,4096,4096,0.021\n")


def _upstream_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "gemm.csv.gz").write_bytes(gzip.compress(GEMM, mtime=0))
    (path / "nccl.csv").write_bytes(NCCL)
    return path


def _vendored_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "gemm.csv.xz").write_bytes(lzma.compress(GEMM))
    (path / "nccl.csv.xz").write_bytes(lzma.compress(NCCL))
    return path


def test_a_table_is_found_by_its_upstream_name_in_any_compression(tmp_path: Path) -> None:
    up, ven = _upstream_dir(tmp_path / "up"), _vendored_dir(tmp_path / "ven")
    assert table_name(up / "gemm.csv.gz") == table_name(ven / "gemm.csv.xz") == "gemm.csv"
    assert resolve(ven / "gemm.csv.gz") == ven / "gemm.csv.xz"
    assert resolve(ven / "nccl.csv") == ven / "nccl.csv.xz"
    assert resolve(up / "nccl.csv") == up / "nccl.csv"  # an existing file wins
    assert resolve(ven / "moe.csv.gz") == ven / "moe.csv.gz"  # missing: the caller's error names it
    for d in (up, ven):
        assert read_text_bytes(d / "gemm.csv.gz") == GEMM
        with open_text(d / "nccl.csv") as f:
            assert f.read().encode() == NCCL


def test_table_digests_and_rows_do_not_depend_on_compression(tmp_path: Path) -> None:
    up, ven = _upstream_dir(tmp_path / "up"), _vendored_dir(tmp_path / "ven")
    rows_up, _, digest_up = read_microbench_dir(up, "h100_sxm")
    rows_ven, _, digest_ven = read_microbench_dir(ven, "h100_sxm")
    assert len(rows_up) == 3
    pd.testing.assert_frame_equal(rows_up, rows_ven)
    assert digest_up == digest_ven == file_sha256([up / "nccl.csv", up / "gemm.csv.gz"])


def test_vendor_writes_xz_copies_a_manifest_and_checks_them(tmp_path: Path) -> None:
    up = tmp_path / "up"
    _upstream_dir(up / "aiconfigurator" / "h100_sxm")
    (up / "SOURCES.md").write_text("sources\n")
    out = tmp_path / "out"
    files = ["aiconfigurator/h100_sxm/gemm.csv.gz", "aiconfigurator/h100_sxm/nccl.csv", "SOURCES.md"]
    entries = vendor(up, out, files, log=open("/dev/null", "w"))  # noqa: SIM115
    assert [e.path for e in entries] == ["aiconfigurator/h100_sxm/gemm.csv.xz", "aiconfigurator/h100_sxm/nccl.csv.xz",
                                         "SOURCES.md"]
    assert [e.rows for e in entries] == [2, 1, None]
    assert lzma.decompress((out / entries[0].path).read_bytes()) == GEMM
    assert check(out, up, text=True) == []
    # unchanged upstream: nothing is rewritten; a file no longer selected is removed
    before = (out / entries[0].path).stat().st_mtime_ns
    vendor(up, out, files[:1], log=open("/dev/null", "w"))  # noqa: SIM115
    assert (out / entries[0].path).stat().st_mtime_ns == before
    assert not (out / "SOURCES.md").exists() and check(out, up, text=True) == []
    # a changed upstream or a tampered copy is reported
    (up / "aiconfigurator" / "h100_sxm" / "gemm.csv.gz").write_bytes(gzip.compress(GEMM + GEMM[-20:]))
    assert check(out, up) == ["aiconfigurator/h100_sxm/gemm.csv.gz: upstream changed; rerun python -m sim.measured.vendor"]
    (out / entries[0].path).write_bytes(lzma.compress(NCCL))
    assert check(out, None) == ["aiconfigurator/h100_sxm/gemm.csv.xz: vendored sha256 differs from MANIFEST.json"]


def test_vendored_files_match_their_manifest_checksums() -> None:
    assert check(MEASURED_DATA, None, text=True) == []


@UPSTREAM
def test_vendored_files_match_upstream() -> None:
    """Upstream file and text checksums equal the manifest's: the copy is the upstream text."""
    assert check(MEASURED_DATA, SHARED_DATA, text=True) == []
    for rel in ("aiconfigurator/h100_sxm/nccl.csv", "aiconfigurator/h100_sxm/wideep_moe.csv.gz",
                "e2e/llmservingsim_vllm_traces/runs.csv", "vidur/cpu_overheads_a100.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(resolve(MEASURED_DATA / rel)), pd.read_csv(SHARED_DATA / rel))


def test_the_copy_holds_every_table_the_project_reads() -> None:
    listed = {f["upstream_path"] for f in load_manifest(MEASURED_DATA)}
    old = [t for t in TABLE_FILES if t != "pointwise.csv" and t not in NEW_TABLE_FILES]
    assert {f"aiconfigurator/{s}/{t}" for s in SYSTEMS for t in old} <= listed
    # Section 4 of the data README: not every GPU has every MoE / MLA / wide-EP table.
    mla = {"mla_bmm.csv", "mla_context.csv.gz", "mla_generation.csv.gz"}
    module = {"mla_module_context.csv.gz", "mla_module_generation.csv.gz"}
    wide = {"wideep_moe.csv.gz", "deepep_ll.csv", "deepep_normal.csv.gz"}
    new = {"a100_sxm": {"moe.csv.gz", *mla}, "l40s": {"moe.csv.gz", *mla, *module},
           "h100_sxm": set(NEW_TABLE_FILES), "h200_sxm": set(NEW_TABLE_FILES),
           "b200_sxm": {"moe.csv.gz", *mla, *module, *wide},
           "rtx_pro_6000_server": {"moe.csv.gz", "wideep_moe.csv.gz", *mla, *module}}
    assert {f"aiconfigurator/{s}/{t}" for s in SYSTEMS for t in new[s]} <= listed
    assert {f"e2e/{f}" for f in DATA_FILES} <= listed
    assert {"aiconfigurator/gpu_specs.csv", "vidur/compute_mlp_ops.csv.gz", "vidur/cpu_overheads_a100.csv"} <= listed
    moe_mla = {"moe.csv.gz", "wideep_moe.csv.gz", "wideep_mlp.csv", "mla_bmm.csv", "mla_context.csv.gz",
               "mla_generation.csv.gz", "mla_module_context.csv.gz", "mla_module_generation.csv.gz",
               "deepep_ll.csv", "deepep_normal.csv.gz"}
    assert {f"aiconfigurator/h100_sxm/{t}" for t in moe_mla} <= listed
    manifest = json.loads((MEASURED_DATA / "MANIFEST.json").read_text())
    assert manifest["total_bytes"] < 30e6


def test_shipped_calibrations_were_fitted_on_the_vendored_tables() -> None:
    """Every data digest a shipped artifact records is the digest of the vendored tables; a
    mismatch means the artifacts need `kernelsight fit-cross-generation --calibrations`."""
    digests: dict[str, str] = {}
    for path in sorted(CALIBRATION_DIR.glob("*.json")):
        recorded = json.loads(path.read_text())["data_sha256"]
        assert recorded, path
        for key, value in recorded.items():
            if key not in digests:
                if key.startswith("vidur/"):
                    digests[key] = file_sha256([MEASURED_DATA / key])
                elif key == "e2e":  # the end-to-end widening: fitted on validate's rows of the e2e tables
                    digests[key] = e2e_sha256(MEASURED_DATA / "e2e")
                else:
                    d = MEASURED_DATA / key.removesuffix(" (plan points)")
                    digests[key] = file_sha256([resolve(d / t) for t in TABLE_FILES if resolve(d / t).is_file()])
            assert value == digests[key], f"{path.name}: {key}"


def test_the_e2e_digest_is_unchanged_by_vendoring() -> None:
    """data_sha256 covers the CSV text of plain-CSV e2e files, so the vendored copy gives the value
    the code before vendoring computed on ../shared/data/e2e (read_bytes of the .csv files)."""
    assert data_sha256(MEASURED_DATA / "e2e").startswith("ea49c3062f699806")


@UPSTREAM
def test_the_e2e_digest_is_the_same_upstream() -> None:
    assert data_sha256(MEASURED_DATA / "e2e") == data_sha256(SHARED_DATA / "e2e")
