"""Plots: one colour per GPU everywhere, units on the axes, configuration labels on Pareto points."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from matplotlib.colors import to_hex

from orchestrator.plot_style import GPU_COLORS, axis_label, config_label, gpu_color, wrap_title
from orchestrator.plots import ScatterPoint, scatter_figure
from orchestrator.sweep.artifacts import breakdown_parts, breakdown_png, breakdown_xlabel, pareto_figure
from orchestrator.sweep.results import Breakdown
from sim.specs.catalog import list_hardware


def test_every_catalog_gpu_has_its_own_colour_and_others_a_stable_one() -> None:
    assert set(GPU_COLORS) == set(list_hardware())
    assert len(set(GPU_COLORS.values())) == len(GPU_COLORS)
    assert gpu_color("h100_sxm") == gpu_color("/tmp/x/h100_sxm.toml") == GPU_COLORS["h100_sxm"]
    assert gpu_color("my_gpu.toml") == gpu_color("my_gpu")


def test_labels_carry_units_and_short_configurations() -> None:
    assert axis_label("cost_per_million_output_tokens_usd", "minimize") == \
        "cost_per_million_output_tokens_usd [USD], minimize"
    assert axis_label("ttft_p90_s") == "ttft_p90_s [s]"
    assert axis_label("output_throughput_tokens_per_s") == "output_throughput_tokens_per_s [tokens/s]"
    params = {"hardware.name": "h100_sxm", "engine.tensor_parallel_size": 2, "engine.max_num_seqs": 64,
              "engine.enable_chunked_prefill": False}
    assert config_label(params) == "h100 tp2 seqs64 nochunk"
    assert "\n" in wrap_title("x " * 60)


def _colours(collection: object) -> set[str]:
    return {to_hex(c) for c in collection.get_facecolors()}  # type: ignore[attr-defined]


def test_pareto_points_are_coloured_by_gpu_and_the_front_is_labelled() -> None:
    points = [(1.0, 3.0), (2.0, 1.0), (3.0, 3.0), (0.5, 4.0)]
    gpus = ["h100_sxm", "a100_sxm", "h100_sxm", "l40s"]
    labels = ["h100 tp1", "a100 tp2", "h100 tp4", "l40s tp1"]
    fig = pareto_figure(points, [True, True, True, False], [0, 1], [axis_label("cost_per_hour_usd", "minimize"),
                        axis_label("ttft_p90_s", "minimize")], "study t", gpus=gpus, point_labels=labels)
    ax = fig.axes[0]
    assert "[USD]" in ax.get_xlabel() and "[s]" in ax.get_ylabel()
    assert {t.get_text() for t in ax.texts} == {"h100 tp1", "a100 tp2"}
    by_label = {c.get_label(): c for c in ax.collections if not c.get_label().startswith("_")}
    assert _colours(by_label["h100"]) == {GPU_COLORS["h100_sxm"]}
    assert _colours(by_label["a100"]) == {GPU_COLORS["a100_sxm"]}
    (l40s,) = [c for c in ax.collections if len(c.get_offsets())
               and {to_hex(e) for e in c.get_edgecolors()} == {GPU_COLORS["l40s"]}]
    assert len(l40s.get_facecolors()) == 0  # misses an SLO: hollow, in its GPU's colour


def test_validation_scatter_uses_the_same_gpu_colours_and_units() -> None:
    points = [ScatterPoint("aiconfigurator", "h100_sxm", "ttft_mean_s", 0.2, 0.25),
              ScatterPoint("llmservingsim", "rtx_4090", "ttft_mean_s", 0.5, 0.4),
              ScatterPoint("aiconfigurator", "h100_sxm", "output_throughput_tokens_per_s", 900.0, 1000.0)]
    fig = scatter_figure(points, "dev suite, cross-generation tier")
    ttft, throughput = fig.axes
    assert ttft.get_xlabel() == "measured mean TTFT [s]" and throughput.get_ylabel().endswith("[tokens/s]")
    assert {to_hex(c) for coll in ttft.collections for c in coll.get_facecolors()} == \
        {GPU_COLORS["h100_sxm"], GPU_COLORS["rtx_4090"]}
    assert scatter_figure([], "empty") is None


def _decode(png: bytes) -> Any:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_breakdown_png_draws_each_share_as_its_width_of_the_bar() -> None:
    names = {"gate_up_proj": 3.0, "paged_decode_attention": 1.0, "qkv_proj": 0.5}
    bd = Breakdown(seconds_by_kind={"gemm": 4.5}, seconds_by_name=names, host_s=0.5, launch_floor_s=0.0)
    parts = breakdown_parts(bd)
    assert parts == [("gate_up_proj", 0.6), ("paged_decode_attention", 0.2), ("qkv_proj", 0.1), ("host", 0.1),
                     ("launch_floor", 0.0)]
    image = _decode(breakdown_png(bd, "trial 3"))
    assert image.shape[1] == 720
    # a row through the bar (the axes span x = 18..702): one run of colour per part, as wide as its share
    bar = next(row for row in image if len({tuple(px) for px in row[18:702]}) == 4)
    runs: list[int] = []
    previous = None
    for px in map(tuple, bar[18:702]):
        if px != previous:
            runs.append(0)
            previous = px
        runs[-1] += 1
    assert [w / 684 for w in runs] == pytest.approx([0.6, 0.2, 0.1, 0.1], abs=1.5 / 684)


def test_breakdown_title_wraps_instead_of_running_off_the_figure() -> None:
    bd = Breakdown(seconds_by_kind={"gemm": 1.0}, seconds_by_name={"gemm": 1.0}, host_s=0.5, launch_floor_s=0.0)
    short = _decode(breakdown_png(bd, "trial 3"))
    long_title = "trial 3: " + ", ".join(f"key_{i}=value_{i}" for i in range(12))
    assert "\n" in wrap_title(long_title, 100)
    wrapped = _decode(breakdown_png(bd, long_title))
    assert wrapped.shape[0] > short.shape[0]  # a second title line, not text cut at the edge
    # no ink in the outer columns: every line fits inside the figure
    assert (wrapped[:, :4] == 255).all() and (wrapped[:, -4:] == 255).all()
    assert "[" not in breakdown_xlabel(bd) and "s busy time (%)" in breakdown_xlabel(bd)
