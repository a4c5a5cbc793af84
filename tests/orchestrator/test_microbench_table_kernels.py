"""Table-keyed microbenchmark collectors: the skip path without the libraries, the routing they
feed the fused MoE kernel, and the table layout `calibrate` reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.microbench.bench import BenchContext
from orchestrator.microbench.output import FILE_OF_TABLE, write_tables
from orchestrator.microbench.points import PlanPoint
from orchestrator.microbench.records import PointRecord
from orchestrator.microbench.runner import _prepare
from orchestrator.microbench.table_kernels import TableShape, routed_ids
from orchestrator.microbench.timing import Measurement, TimingParams
from sim.calibration.rows import ROW_COLUMNS
from sim.calibration.tables import NEW_TABLE_FILES, read_microbench_dir
from sim.graph.moe_routing import moe_rank0_load, rank0_expert_counts

_CTX = BenchContext(torch=None, device="cpu", dry_run=False, timing=TimingParams(), rotate_bytes=1, max_rotation_bytes=1)


def _row(**values: object) -> dict[str, str]:
    return {c: str(values.get(c, "")) for c in ROW_COLUMNS}


_ROWS = {
    "moe": _row(kernel="moe", moe_dtype="bfloat16", num_tokens=64, hidden_size=7168, inter_size=2048, topk=8,
                num_experts=256, moe_tp_size=1, moe_ep_size=8, distribution="power_law_1.01"),
    "mla_generation": _row(kernel="mla_generation", num_heads=16, batch_size=8, kv_len=1024,
                           kv_cache_dtype="bfloat16"),
    "mla_bmm": _row(kernel="mla_bmm", op_name="mla_gen_pre", bmm_dtype="bfloat16", num_tokens=32, num_heads=16),
    "deepep_ll": _row(kernel="deepep_ll", node_num=1, num_gpus=8, hidden_size=7168, num_tokens_per_rank=128,
                      topk=8, num_experts=256),
    "mla_context": _row(kernel="mla_context", num_heads=16, batch_size=1, seq_len=1024, kv_cache_dtype="bfloat16"),
}
_FAMILY = {"moe": "moe", "mla_generation": "mla", "mla_bmm": "mla_bmm", "deepep_ll": "deepep", "mla_context": "mla"}
_NAMED = {"moe": "vllm: not installed", "mla_generation": "flash_mla: not installed",
          "mla_bmm": "torch is not installed", "deepep_ll": "deep_ep: not installed", "mla_context": "no kernelsight"}


@pytest.mark.parametrize("kernel", sorted(_ROWS))
def test_without_the_libraries_every_table_point_is_skipped_naming_what_is_missing(kernel: str) -> None:
    point = PlanPoint(number=1, family=_FAMILY[kernel], row=_ROWS[kernel])  # type: ignore[arg-type]
    prepared, reasons, crashed = _prepare(point, _CTX)
    assert prepared is None and not crashed
    assert _NAMED[kernel] in reasons
    if kernel == "mla_generation":
        assert "flashinfer: not installed" in reasons  # the fallback is named too


def test_routed_ids_give_each_local_expert_its_count_by_hand() -> None:
    # 4 tokens, top-2 of 8 experts, 2 local experts (EP 4) with 3 and 1 tokens; the rest go elsewhere.
    assert routed_ids(4, 2, 8, [3, 1]) == [[0, 2], [0, 3], [0, 4], [1, 5]]
    ids = routed_ids(512, 8, 256, [int(c) for c in rank0_expert_counts(512, 256, 8, 8, "power_law_1.01")])
    local = [e for row in ids for e in row if e < 32]
    assert all(len(set(row)) == len(row) or max(row) >= 32 for row in ids)
    # Balanced routing: exactly 1/8 of the selections land on rank 0; the power-law draw stays near the
    # mean of draws the kernel model uses.
    assert int(rank0_expert_counts(512, 256, 8, 8, "balanced").sum()) == 512
    pairs, _, _ = moe_rank0_load(512, 256, 8, 8, "power_law_1.01")
    assert 0.5 * pairs < len(local) < 2.0 * pairs


def test_measured_table_rows_are_written_in_the_layout_calibrate_reads(tmp_path: Path) -> None:
    assert sorted(FILE_OF_TABLE.values()) == sorted(NEW_TABLE_FILES)
    labels = {"backend": "vllm", "backend_version": "0.11.0", "kernel_source": "x"}
    m = Measurement(median_s=2e-4, p10_s=2e-4, p90_s=2e-4, calls_per_repeat=1, repeats=1, timing="cuda_graph")
    # DeepEP rows carry their dispatch and combine parts (orchestrator.microbench.deepep).
    parts = {"deepep_ll": {"dispatch_latency_ms": 0.05, "combine_latency_ms": 0.15}}
    records = [PointRecord(number=i, key=k, status="measured", reason="", row={**_ROWS[k], **labels}, measurement=m,
                           parts_ms=parts.get(k, {}))
               for i, k in enumerate(("moe", "mla_generation", "mla_bmm", "deepep_ll"), start=1)]
    counts = write_tables(tmp_path, records, None)
    assert counts == {"moe.csv.gz": 1, "mla_generation.csv.gz": 1, "mla_bmm.csv": 1, "deepep_ll.csv": 1}
    rows, excluded, _ = read_microbench_dir(tmp_path, "h100_sxm")
    assert sorted(rows.kernel) == ["deepep_ll", "mla_bmm", "mla_generation", "moe"] and not excluded
    assert list(rows.latency_s) == pytest.approx([2e-4] * 4)
    moe = rows[rows.kernel == "moe"].iloc[0]
    assert (int(moe.num_experts), int(moe.moe_ep_size), moe.distribution) == (256, 8, "power_law_1.01")
    assert TableShape(kernel="moe", family="moe", row=_ROWS["moe"]).integer("num_tokens") == 64
