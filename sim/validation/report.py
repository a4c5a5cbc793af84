"""Markdown for the `## End-to-end` section of docs/accuracy.md (plain text; plots are files).

The section is regenerated as a whole, except a `### Analysis` subsection, which is written by
people and carried over from the previous document (`carry_analysis`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from sim.validation.rows import DUPLICATE_PREFIX, HEADLINE_METRICS, ValidationRow
from sim.validation.runner import RowResult
from sim.validation.score import DISTRIBUTION_METRICS, GroupScore, metric_stats

HEADING: Final = "## End-to-end"
ANALYSIS: Final = "### Analysis"
TARGETS: Final = {
    "target-measured": {"ttft": 0.143, "tpot": 0.062, "throughput": 0.027},
    "cross-generation": {"ttft": 0.154, "tpot": 0.128, "throughput": 0.030},
}
"""Published p50 APE of the reference method on the eval suite (issue 7)."""
KIND_GROUPS: Final = {"gemm": ("gemm", "moe_gemm"), "attention": ("attn_prefill", "attn_decode"),
                      "communication": ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"),
                      "host": ("host", "launch_floor")}


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _signed(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:+.1f}%"


def headline_table(groups: Sequence[GroupScore]) -> list[str]:
    lines = ["| tier | metric | eval p50 APE | target | met | eval rows |", "|---|---|---|---|---|---|"]
    for tier, targets in TARGETS.items():
        g = next((x for x in groups if x.suite == "eval" and x.tier == tier and x.source == "all"), None)
        for metric, target in targets.items():
            s = g.metrics.get(metric) if g else None
            med = s.median_ape if s else math.nan
            met = "n/a" if med != med else ("yes" if med <= target else "no")
            lines.append(f"| {tier} | {metric} | {_pct(med)} | <= {_pct(target)} | {met} | {s.n if s else 0} |")
    return lines


def groups_table(groups: Sequence[GroupScore]) -> list[str]:
    head = ("| suite | tier | source | scored | skipped | deferred | failed | TTFT p50 / p90 (bias) "
            "| TPOT p50 / p90 (bias) | throughput p50 / p90 (bias) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for g in groups:
        cells = []
        for metric in HEADLINE_METRICS:
            s = g.metrics.get(metric)
            cells.append("-" if s is None or s.n == 0 else
                         f"{_pct(s.median_ape)} / {_pct(s.p90_ape)} ({_signed(s.median_signed)}, n={s.n})")
        source = f"**{g.source}**" if g.source == "all" else g.source
        lines.append(f"| {g.suite} | {g.tier} | {source} | {g.rows_scored} | {g.rows_skipped} | {g.rows_deferred} "
                     f"| {g.rows_failed} | " + " | ".join(cells) + " |")
    return lines


FAMILY_ORDER: Final = {"dense": 0, "moe": 1, "mla": 2, "unknown": 3}
DISAGG_PREFIX: Final = "disaggregated"


def _cells(items: Sequence[tuple[ValidationRow, RowResult | None]], deferred: Mapping[str, str]) -> list[str]:
    """rows, scored, skipped, deferred, failed, then p50 APE (bias) of TTFT, TPOT, throughput."""
    scored = [(row, r) for row, r in items if r is not None and r.status == "scored"]
    skipped = sum(1 for row, r in items if (r is not None and r.status == "skipped") or (r is None and row.skipped))
    out = [str(len(items)), str(len(scored)), str(skipped),
           str(sum(1 for row, r in items if r is None and row.row_id in deferred)),
           str(sum(1 for _, r in items if r is not None and r.status == "failed"))]
    for key in HEADLINE_METRICS.values():
        s = metric_stats([(r.predicted[key], row.measured[key]) for row, r in scored
                          if key in row.measured and key in r.predicted])
        out.append("-" if s.n == 0 else f"{_pct(s.median_ape)} ({_signed(s.median_signed)})")
    return out


def _aggregated(rows: Sequence[ValidationRow]) -> list[ValidationRow]:
    """AIConfigurator rows of aggregated serving (disaggregated rows, and duplicates of another row's
    measurement, are counted in the skipped table)."""
    return [r for r in rows if r.source == "aiconfigurator" and not r.disaggregated
            and not (r.skip_reason or "").startswith((DISAGG_PREFIX, DUPLICATE_PREFIX))]


def disaggregated_table(rows: Sequence[ValidationRow], results: Sequence[RowResult], *, tiers: Sequence[str],
                        deferred: Mapping[str, str]) -> list[str]:
    """AIConfigurator rows per system x model x suite x tier, aggregated and disaggregated side by side."""
    res = {(r.row_id, r.tier): r for r in results}
    groups: dict[tuple[str, str, str, str], dict[bool, list[tuple[ValidationRow, RowResult | None]]]] = {}
    disagg_keys = {(r.hardware, r.model) for r in rows if r.source == "aiconfigurator" and r.disaggregated}
    for row in rows:
        if (row.source != "aiconfigurator" or (row.hardware, row.model) not in disagg_keys
                or (row.skip_reason or "").startswith(DUPLICATE_PREFIX)):
            continue
        for tier in tiers:
            key = (row.hardware, row.model, row.suite, tier)
            groups.setdefault(key, {False: [], True: []})[row.disaggregated].append((row, res.get((row.row_id, tier))))
    lines = ["| system | model | suite | tier | agg rows / scored | agg TTFT p50 APE (bias) | agg TPOT p50 APE (bias) "
             "| disagg rows / scored / skipped | disagg TTFT p50 APE (bias) | disagg TPOT p50 APE (bias) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (system, model, suite, tier), by_mode in sorted(groups.items()):
        agg, dis = _cells(by_mode[False], deferred), _cells(by_mode[True], deferred)
        lines.append(f"| {system} | {model} | {suite} | {tier} | {agg[0]} / {agg[1]} | {agg[5]} | {agg[6]} "
                     f"| {dis[0]} / {dis[1]} / {dis[2]} | {dis[5]} | {dis[6]} |")
    return lines


def family_table(rows: Sequence[ValidationRow], results: Sequence[RowResult], *, tiers: Sequence[str],
                 deferred: Mapping[str, str]) -> list[str]:
    """Aggregated AIConfigurator rows per architecture family x suite x tier (the MoE / MLA coverage target)."""
    res = {(r.row_id, r.tier): r for r in results}
    groups: dict[tuple[int, str, str, str], list[tuple[ValidationRow, RowResult | None]]] = {}
    for row in _aggregated(rows):
        for tier in tiers:
            key = (FAMILY_ORDER[row.family], row.family, row.suite, tier)
            groups.setdefault(key, []).append((row, res.get((row.row_id, tier))))
    lines = ["| family | suite | tier | rows | scored | skipped | deferred | failed | simulable | TTFT p50 APE (bias) "
             "| TPOT p50 APE (bias) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (_, family, suite, tier), items in sorted(groups.items()):
        cells = _cells(items, deferred)
        simulable = sum(1 for row, r in items if not row.skipped and (r is None or r.status != "skipped"))
        share = f"{simulable} ({100 * simulable / len(items):.0f}%)" if items else "0"
        lines.append(f"| {family} | {suite} | {tier} | " + " | ".join(cells[:5]) + f" | {share} | "
                     + " | ".join(cells[5:7]) + " |")
    return lines


def per_model_table(rows: Sequence[ValidationRow], results: Sequence[RowResult], *, tiers: Sequence[str],
                    deferred: Mapping[str, str]) -> list[str]:
    """Aggregated AIConfigurator rows per system x suite x family x model x tier: dense, MoE and MLA
    models of one system side by side, evaluation rows in their own lines."""
    res = {(r.row_id, r.tier): r for r in results}
    groups: dict[tuple[str, str, int, str, str], list[tuple[ValidationRow, RowResult | None]]] = {}
    for row in _aggregated(rows):
        for tier in tiers:
            key = (row.hardware, row.suite, FAMILY_ORDER[row.family], row.model, tier)
            groups.setdefault(key, []).append((row, res.get((row.row_id, tier))))
    lines = ["| system | suite | family | model | tier | rows | scored | skipped | deferred | failed "
             "| TTFT p50 APE (bias) | TPOT p50 APE (bias) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = {v: k for k, v in FAMILY_ORDER.items()}
    for (system, suite, fam, model, tier), items in sorted(groups.items()):
        cells = _cells(items, deferred)
        lines.append(f"| {system} | {suite} | {names[fam]} | {model} | {tier} | " + " | ".join(cells[:7]) + " |")
    return lines


def trace_table(rows: Sequence[ValidationRow], results: Sequence[RowResult]) -> list[str]:
    res = {(r.row_id, r.tier): r for r in results}
    lines = ["| run | tier | " + " | ".join(m.removesuffix("_s").replace("_", " ") for m in DISTRIBUTION_METRICS)
             + " | throughput |", "|---|---|" + "---|" * (len(DISTRIBUTION_METRICS) + 1)]
    for row in rows:
        if row.source != "llmservingsim":
            continue
        for tier in ("cross-generation", "target-measured"):
            r = res.get((row.row_id, tier))
            if r is None or r.status != "scored":
                continue
            cells = [_cell(r.predicted.get(k, math.nan), row.measured[k], scale=1e3, unit="ms")
                     for k in DISTRIBUTION_METRICS]
            key = "output_throughput_tokens_per_s"
            cells.append(_cell(r.predicted.get(key, math.nan), row.measured[key], scale=1.0, unit="tok/s"))
            lines.append(f"| {row.label} | {tier} | " + " | ".join(cells) + " |")
    return lines


def _cell(pred: float, meas: float, *, scale: float, unit: str) -> str:
    return f"{pred * scale:.4g} vs {meas * scale:.4g} {unit} ({_signed(pred / meas - 1)})"


def breakdown_tables(rows: Sequence[ValidationRow], results: Sequence[RowResult], *, suite: str) -> list[str]:
    """Signed error by backend and by load regime, and where simulated time goes (evidence for the analysis)."""
    by_id = {r.row_id: r for r in rows if r.suite == suite}
    out: list[str] = []
    for title, keyer in (("backend", _backend_key), ("load regime", _regime_key), ("KV-cache state", _kv_key)):
        buckets: dict[tuple[str, str], list[tuple[ValidationRow, RowResult]]] = {}
        for res in results:
            row = by_id.get(res.row_id)
            if row is None or res.status != "scored":
                continue
            buckets.setdefault((res.tier, keyer(row, res)), []).append((row, res))
        out += [f"#### {suite} suite: signed median error (and p50 APE) by {title}", "",
                f"| tier | {title} | rows | TTFT | TPOT | throughput | host CPU share* | GEMM share | attention share "
                "| comm share |", "|---|---|---|---|---|---|---|---|---|---|"]
        for (tier, key), items in sorted(buckets.items()):
            cells = []
            for metric_key in HEADLINE_METRICS.values():
                pairs = [(r.predicted[metric_key], row.measured[metric_key]) for row, r in items
                         if metric_key in row.measured and metric_key in r.predicted]
                s = metric_stats(pairs)
                cells.append("-" if s.n == 0 else f"{_signed(s.median_signed)} ({_pct(s.median_ape)})")
            shares = [_share(items, kinds) for kinds in KIND_GROUPS.values()]
            hs, gs, ats, cs = (shares[3], shares[0], shares[1], shares[2])
            out.append(f"| {tier} | {key} | {len(items)} | " + " | ".join(cells)
                       + f" | {_pct(hs)} | {_pct(gs)} | {_pct(ats)} | {_pct(cs)} |")
        out.append("")
    return out


def worst_rows_table(rows: Sequence[ValidationRow], results: Sequence[RowResult], *, suite: str,
                     limit: int = 12) -> list[str]:
    """The rows with the largest errors (any headline metric), with where their simulated time went."""
    by_id = {r.row_id: r for r in rows if r.suite == suite}
    scored: list[tuple[float, ValidationRow, RowResult]] = []
    for res in results:
        row = by_id.get(res.row_id)
        if row is None or res.status != "scored":
            continue
        errs = [abs(math.log(res.predicted[k] / row.measured[k])) for k in HEADLINE_METRICS.values()
                if k in row.measured and res.predicted.get(k, 0) > 0 and row.measured[k] > 0]
        if errs:
            scored.append((max(errs), row, res))
    scored.sort(key=lambda t: -t[0])
    lines = [f"#### {suite} suite: largest errors, per row", "",
             "| row | tier | TTFT pred / meas | TPOT pred / meas | tok/s pred / meas | GEMM | attention | comm "
             "| host CPU* | KV peak |", "|---|---|---|---|---|---|---|---|---|---|"]
    for _, row, res in scored[:limit]:
        cells = []
        for key, scale, fmt in (("ttft_mean_s", 1e3, "{:.0f} / {:.0f} ms"), ("tpot_mean_s", 1e3, "{:.1f} / {:.1f} ms"),
                                ("output_throughput_tokens_per_s", 1.0, "{:.0f} / {:.0f}")):
            m = row.measured.get(key)
            cells.append("-" if m is None else fmt.format(res.predicted.get(key, math.nan) * scale, m * scale))
        shares = [_pct(sum(res.time_share.get(k, 0.0) for k in kinds)) for kinds in KIND_GROUPS.values()]
        lines.append(f"| {row.label} | {res.tier} | " + " | ".join(cells) + " | " + " | ".join(shares)
                     + f" | {res.kv_usage_max_frac:.0%} |")
    return [*lines, ""]


def _share(items: Sequence[tuple[ValidationRow, RowResult]], kinds: tuple[str, ...]) -> float:
    vals = [sum(r.time_share.get(k, 0.0) for k in kinds) for _, r in items if r.time_share]
    return float(np.mean(vals)) if vals else math.nan


def _backend_key(row: ValidationRow, _: RowResult) -> str:
    return f"{row.backend} ({row.source})"


def _kv_key(_: ValidationRow, res: RowResult) -> str:
    """Saturated: the simulated KV cache filled up (peak use >= 95% or a preemption)."""
    return "saturated (KV full)" if res.kv_usage_max_frac >= 0.95 or res.num_preemptions else "KV headroom"


def _regime_key(row: ValidationRow, _: RowResult) -> str:
    rep = row.replay
    if rep is None:
        return "n/a"
    if rep.kind == "closed_loop":
        c = rep.concurrency
        band = "C <= 8" if c <= 8 else ("C 16-64" if c <= 64 else "C >= 128")
        return f"closed loop, {band}"
    return rep.kind.replace("_", " ")


def skipped_table(rows: Sequence[ValidationRow], results: Sequence[RowResult],
                  deferred: Mapping[str, str]) -> list[str]:
    """Skip / defer reasons with counts (per suite and source), not one line per row."""
    counts: dict[tuple[str, str, str, str], int] = {}
    by_id = {r.row_id: r for r in rows}
    for row in rows:
        if row.skip_reason is not None:
            key = (row.suite, row.source, "skipped", _generic(row.skip_reason))
            counts[key] = counts.get(key, 0) + 1
        elif row.row_id in deferred:
            key = (row.suite, row.source, "deferred", _generic(deferred[row.row_id]))
            counts[key] = counts.get(key, 0) + 1
    for res in results:
        if res.status == "skipped" and res.reason is not None:
            found = by_id.get(res.row_id)
            if found is not None and found.skip_reason is None:
                key = (found.suite, found.source, f"skipped ({res.tier})", _generic(res.reason))
                counts[key] = counts.get(key, 0) + 1
    lines = ["| suite | source | status | reason | rows |", "|---|---|---|---|---|"]
    for (suite, source, status, reason), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[1])):
        lines.append(f"| {suite} | {source} | {status} | {reason.replace('|', '/')} | {n} |")
    return lines


def _generic(reason: str) -> str:
    """Per-row numbers out of a reason so identical causes group together."""
    if reason.startswith("estimated"):
        return "estimated simulation time over the per-row cap"
    if reason.startswith(DUPLICATE_PREFIX):  # "duplicate of <row id>: <why>"
        return "duplicate of another row (scored once): " + reason.partition(": ")[2]
    return reason


def _plain_rate(cost: dict[str, Any]) -> str:
    """The prefill-priority backends' rate of the cost model, where the run recorded one."""
    rate = float(cost.get("per_plain_request_step_s", 0.0))
    backends = ", ".join(cost.get("request_by_request", ()))
    if not (rate and backends):
        return ""
    return f" ({rate * 1e6:.2f} us for {backends}, whose prefill-only steps cut the bulk-decode runs)"


def _budget_paragraph(result: Mapping[str, Any], results: Sequence[RowResult]) -> str:
    """How the run chose its rows: every simulable one (the default), or a `--budget-s` sample."""
    cost = result["cost_model"]
    model = (f"cost model {cost['per_step_s'] * 1e6:.1f} us per step + {cost['per_request_step_s'] * 1e6:.2f} us "
             f"per running request per step{_plain_rate(cost)}, measured at start")
    simulated = [r for r in results if r.status != "skipped"]
    copied = sum(r.same_simulation_as is not None for r in simulated)
    shared = ("rows of one pricing group share kernel models and priced step parts in a worker; "
              f"{copied:,} of the {len(simulated):,} row x tier results repeat another row's simulation (the "
              "same scenario and replay: one configuration measured again, e.g. in two releases' tables) and "
              "copy its results")
    if result["budget_s"] <= 0:
        return (f"No time budget (the default): every simulable row is simulated and scored, none deferred "
                f"({model}, orders the work; {shared}). Every simulated row replays all requests of its "
                "measured run. A quick `kernelsight validate --budget-s S` scores a random sample of them "
                "within S seconds of estimated simulation per worker.")
    return (f"Time budget: {result['budget_s']:.0f} s of estimated simulation per worker ({model}; {shared}), "
            f"per-row cap {result['max_row_s']:.0f} s. Every simulated row replays all requests of its "
            "measured run. Rows over the budget are listed as deferred, never dropped: the budget is split "
            "over (suite, source) groups (an eval group weighs two dev groups) and rows are taken in a fixed hash "
            "order, so a deferred row is a random one, not a hard one; `kernelsight validate` without a budget "
            "simulates all of them.")


def render_section(result: Mapping[str, Any], rows: Sequence[ValidationRow], results: Sequence[RowResult],
                   groups: Sequence[GroupScore], deferred: Mapping[str, str], plots: Sequence[str]) -> str:
    every_row = result["budget_s"] <= 0
    budget_flag = "" if every_row else f" --budget-s {result['budget_s']:.0f}"
    out = [HEADING, "",
           f"Regenerate with `kernelsight validate{budget_flag}` "
           f"(suite {result['suite']}, tiers "
           f"{', '.join(result['tiers'])}; took {result['wall_s']:.0f} s with {result['jobs']} worker processes on "
           f"{result['machine']}). Measured data: `e2e/` tables (shipped in sim/data/measured, copied from "
           f"shared/data/e2e; sha256 of their text {result['data_sha256'][:16]}). "
           "APE = |predicted - measured| / measured per row; bias = median of predicted / measured - 1. "
           "Headline metrics per row: mean TTFT and mean TPOT (AIConfigurator closed loops, LLMServingSim traces, "
           "TensorRT-LLM batch-1 first-token latency) and output tokens/s (traces, TensorRT-LLM throughput and "
           "static-batch tables). How rows become scenarios, the estimators for shortened runs and the engine "
           "profiles: [docs/validation.md](validation.md).",
           "",
           _budget_paragraph(result, results), "",
           "### Eval suite against the targets", "", *headline_table(groups), "",
           "### Per suite x tier x source", "", *groups_table(groups), ""]
    tiers = list(result["tiers"])
    if any(r.source == "aiconfigurator" for r in rows):
        out += ["### Per architecture family (AIConfigurator aggregated rows)", "",
                "Family: `dense`, `moe` (mixture of experts), `mla` (multi-head latent attention + MoE: "
                "DeepSeek-V3 / R1, Kimi-K2.5, GLM-5). Simulable: rows the simulator can represent (not skipped), "
                "whether or not the time budget reached them. APE (bias) over scored rows.", "",
                *family_table(rows, results, tiers=tiers, deferred=deferred), "",
                "### Per model (AIConfigurator aggregated rows)", "",
                "Per GPU and suite, dense models first, then MoE, then MLA models; evaluation rows (b200_sxm, "
                "Llama-3.1-70B, Kimi-K2.5, GLM-5) are their own lines. Disaggregated rows are in the next table.", "",
                *per_model_table(rows, results, tiers=tiers, deferred=deferred), "",
                "### Disaggregated rows beside aggregated rows (AIConfigurator)", "",
                "Each system and model with disaggregated rows: its aggregated and disaggregated rows side by side "
                "(docs/disaggregation.md). Disaggregated rows that cannot be simulated are in the skipped table with "
                "their reason; among them the InferenceX rows whose export records no worker counts and that have "
                "no db-dump twin.", "",
                *disaggregated_table(rows, results, tiers=tiers, deferred=deferred), ""]
    trace = trace_table(rows, results)
    if len(trace) > 2:
        out += ["### LLMServingSim traces: predicted vs measured distributions", "", *trace, ""]
    if plots:
        out += ["### Predicted vs measured", ""]
        out += [f"![{p}]({p})" for p in plots] + [""]
    out += ["### Where the error comes from (evidence)", "",
            "Shares are of the simulated busy time summed over kernels, collectives and host CPU work "
            "(\\*host CPU work overlaps the GPU when the engine schedules asynchronously, as every profile "
            "does for recent releases: it then costs time only in steps where it exceeds the GPU work). "
            "Signed error: median of predicted / measured - 1.", ""]
    for suite in ("eval", "dev"):
        if any(r.suite == suite for r in rows):
            out += breakdown_tables(rows, results, suite=suite)
            out += worst_rows_table(rows, results, suite=suite)
    coverage = interval_coverage_table(result.get("interval_coverage", []))
    if coverage:
        out += ["### Interval coverage (`--intervals K`)", "",
                f"Nominal 90% intervals of each scored aggregated row from {result.get('intervals', 0)} perturbed "
                "runs (`run --intervals`, docs/kernel-model.md#intervals: one latency factor per kernel family "
                "and run, drawn from the kernel intervals of the row's tier and architecture class). Coverage: "
                "share of rows whose measured value lies in the interval; width: mean (hi - lo) / predicted. "
                "End-to-end widened: the same intervals stretched by the end-to-end widening "
                "(`sim/calibration/e2e_widening.py`), conformalized on the dev suite's rows only: on the dev rows "
                "it was fitted on, its coverage is in-sample; the eval rows never fitted anything.", "",
                *coverage, ""]
    out += ["### Skipped and deferred rows", "", *skipped_table(rows, results, deferred), ""]
    return "\n".join(out) + "\n"


def interval_coverage_table(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown of `score.interval_coverage` (empty without intervals)."""
    if not cells:
        return []
    e2e = "coverage_e2e" in cells[0]
    head = "| suite | tier | metric | rows | coverage (kernel draws) | mean relative width |"
    lines = [head + (" coverage (end-to-end widened) | mean relative width |" if e2e else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if e2e else "")]
    for c in cells:
        line = (f"| {c['suite']} | {c['tier']} | {c['metric']} | {c['rows']} | {_pct(c['coverage'])} "
                f"| {_pct(c['mean_rel_width'])} |")
        if e2e:
            line += f" {_pct(c['coverage_e2e'])} | {_pct(c['mean_rel_width_e2e'])} |"
        lines.append(line)
    return lines


def carry_analysis(old_doc: str) -> str:
    """The `### Analysis` block of the previous End-to-end section ('' if none)."""
    lines = old_doc.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == HEADING), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    a = next((i for i in range(start, end) if lines[i].rstrip() == ANALYSIS), None)
    if a is None:
        return ""
    b = next((i for i in range(a + 1, end) if lines[i].startswith("### ")), end)
    return "".join(lines[a:b]).rstrip("\n") + "\n"
