"""Markdown for the kernel section of docs/accuracy.md from a leave-one-GPU-out result."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sim.calibration.families import BASE_FAMILIES, FAMILIES_REPORTED, KEEP_FRAC, headline

TIER_COLUMNS: Final = ("roofline", "naive", "cross-generation", "target-measured")


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _headline_table(result: Mapping[str, Any]) -> list[str]:
    lines = ["| held-out GPU | roofline | naive transfer | cross-generation | target-measured "
             "| cross-gen on target's rows | plan points / calibration rows "
             "| earlier six families: cross-generation / target-measured |",
             "|---|---|---|---|---|---|---|---|"]
    for g in result["gpus"]:
        t = g["tiers"]
        name = g["gpu"] + (" (evaluation only)" if g["gpu"] == "b200_sxm" else "")
        lines.append(f"| {name} | " + " | ".join(_pct(headline(t[c])) for c in TIER_COLUMNS)
                     + f" | {_pct(headline(t['cross-generation (same rows as target)']))}"
                     + " | " + (f"{g['plan_points']} / {g['calibration_points']}" if g["calibration_points"]
                                else "none (evaluation only)")
                     + f" | {_pct(headline(t['cross-generation'], BASE_FAMILIES))} / "
                       f"{_pct(headline(t['target-measured'], BASE_FAMILIES))} |")
    logo = [g for g in result["gpus"] if g["gpu"] != "b200_sxm"]
    if logo:
        means = [sum(headline(g["tiers"][c]) for g in logo) / len(logo) for c in TIER_COLUMNS]
        base = [sum(headline(g["tiers"][c], BASE_FAMILIES) for g in logo) / len(logo)
                for c in ("cross-generation", "target-measured")]
        lines.append("| **mean of leave-one-out GPUs** | " + " | ".join(f"**{_pct(m)}**" for m in means)
                     + f" | | | **{_pct(base[0])} / {_pct(base[1])}** |")
    return lines


def _family_table(g: Mapping[str, Any]) -> list[str]:
    lines = [f"#### {g['gpu']}", "",
             "| family | rows | " + " | ".join(f"{c} median / p90" for c in TIER_COLUMNS) + " |",
             "|---|---|" + "---|" * len(TIER_COLUMNS)]
    for fam in FAMILIES_REPORTED:
        cells = []
        rows = ""
        for c in TIER_COLUMNS:
            s = g["tiers"][c].get(fam)
            if s is None:
                cells.append("-")
                continue
            rows = rows or str(s["rows"])
            cells.append(f"{_pct(s['median_ape'])} / {_pct(s['p90_ape'])}")
        if rows:
            lines.append(f"| {fam} | {rows} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _intervals_table(rows: list[Mapping[str, Any]]) -> list[str]:
    """Per GPU and tier: coverage and relative width of the nominal 90% intervals (nested
    leave-one-GPU-out), then per family."""
    out = ["### Intervals", "",
           "Nominal 90% central intervals (split-conformal, docs/kernel-model.md#intervals). On a dev GPU the "
           "quantiles come from the other dev GPUs' leave-one-GPU-out residuals only (nested); b200_sxm "
           "(evaluation only) is scored with the quantiles of all dev GPUs and never contributes to one. "
           "Fitted tiers take the quantiles of the dev GPUs of the GPU's architecture class: `seen` (another "
           "dev GPU has its SM version: h100_sxm, h200_sxm) or `new` (none has: a100_sxm, l40s, "
           "rtx_pro_6000_server; b200_sxm). "
           "Coverage = share of rows whose measured latency lies in the interval; width = (hi - lo) / "
           "predicted. Per GPU: mean over families (min family in brackets) and over rows.", "",
           "| GPU | tier | architecture | coverage, mean of families (min) | coverage over rows "
           "| mean relative width |",
           "|---|---|---|---|---|---|"]
    keys = sorted({(r["gpu"], r["tier"]) for r in rows}, key=lambda k: (k[0] == "b200_sxm", k[0], k[1]))
    for gpu, tier in keys:
        sel = [r for r in rows if r["gpu"] == gpu and r["tier"] == tier]
        cov = [r["coverage"] for r in sel]
        n = sum(r["rows"] for r in sel)
        pooled = sum(r["coverage"] * r["rows"] for r in sel) / n
        width = sum(r["rel_width"] for r in sel) / len(sel)
        arch = (sel[0].get("architecture") or "-").removesuffix("-architecture")
        out.append(f"| {gpu} | {tier} | {arch} | {_pct(sum(cov) / len(cov))} ({_pct(min(cov))}) | {_pct(pooled)} "
                   f"| {_pct(width)} |")
    out += ["", "| GPU | tier | family | rows | coverage | relative width |", "|---|---|---|---|---|---|"]
    for gpu, tier in keys:
        for r in rows:
            if r["gpu"] == gpu and r["tier"] == tier:
                out.append(f"| {gpu} | {tier} | {r['family']} | {r['rows']} | {_pct(r['coverage'])} "
                           f"| {_pct(r['rel_width'])} |")
    return [*out, ""]


def render_kernels_section(result: Mapping[str, Any]) -> str:
    frac = ", ".join(f"{k} {v:.0%}" for k, v in KEEP_FRAC.items())
    out = [
        "## Kernels", "",
        "Regenerate with `kernelsight accuracy kernels [--json]` "
        f"(took {result.get('wall_s', 0):.0f} s on the 2-core box).",
        "APE = |predicted - measured| / measured per kernel call. Headline = mean over families of the "
        "per-family median APE. Leave-one-GPU-out: the cross-generation model is refitted without "
        "the held-out GPU (and never sees b200_sxm); target-measured adds a correction fitted only "
        "on the held-out GPU's rows at `kernelsight microbench plan` points and is scored only on "
        "units the plan does not touch (GEMM (n,k) sites, attention head configurations, "
        "collective message sizes, MoE expert shapes, MLA heads per GPU, DeepEP layouts); "
        "'cross-gen on target's rows' is the cross-generation tier on "
        "exactly those rows. Naive transfer = mean log-efficiency of the same shape on the training "
        "GPUs (family median when no training GPU measured it). b200_sxm is evaluation only: it gets "
        "no target-measured score, because calibrating on it would fit on its rows.",
        f"Rows are subsampled deterministically by a hash of the shape (same shapes on every GPU): "
        f"{frac}, all rows of the other families.", "",
        *_headline_table(result), "", "### Per family", "",
    ]
    for g in result["gpus"]:
        out += _family_table(g)
    if result.get("intervals"):
        out += _intervals_table(result["intervals"])
    out += ["### Excluded (data README: broken series and flagged rows)", "",
            "| system | table | what | rows |", "|---|---|---|---|"]
    out += [f"| {e['system']} | {e['table']} | {e['what']} | {e['rows']} |" for e in result["exclusions"]]
    return "\n".join(out) + "\n"


def replace_section(doc: str, heading: str, section: str) -> str:
    """`doc` with the `heading` section (up to the next `## `) replaced by `section`."""
    lines = doc.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == heading), None)
    if start is None:
        return doc.rstrip("\n") + "\n\n" + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "".join(lines[:start]) + section + ("\n" if end < len(lines) else "") + "".join(lines[end:])
