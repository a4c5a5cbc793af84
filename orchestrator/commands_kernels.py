"""CLI verbs of the kernel model: predict-kernels (tiered), calibrate, microbench plan,
accuracy kernels, fit-cross-generation."""

from __future__ import annotations

import csv
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any, Final

import numpy as np

from orchestrator.out_dir import prepare_out_file
from sim.calibration.artifact import load_artifact
from sim.calibration.batch import predict_latency_s
from sim.calibration.plan import MAX_GPU_S, MAX_POINTS, estimate_gpu_s, microbench_plan
from sim.calibration.rows import (
    BASE_COLUMNS,
    INTERVAL_COLUMNS,
    PREDICTION_COLUMNS,
    ROW_COLUMNS,
    TABLE_KV_CACHE_DTYPES,
    TABLE_LEVELS,
    TABLE_ROW_COLUMNS,
    ZERO_ALLOWED,
    max_cell,
    row_to_work,
    valid_distribution,
)
from sim.calibration.select import CALIBRATION_DIR, CROSS_GENERATION_FILE, load_for_tier, shipped_calibration
from sim.errors import ConfigError, decode_error, file_error
from sim.measured import measured_data_root
from sim.perf.fitted import FittedEfficiency
from sim.perf.table_kernels import NUMERIC as TABLE_NUMERIC
from sim.perf.table_kernels import REQUIRED as TABLE_REQUIRED
from sim.perf.table_kernels import TABLE_COLUMNS
from sim.provenance import Provenance
from sim.serde import check_unique_columns
from sim.specs.catalog import load_hardware
from sim.specs.hardware import HardwareSpec

DATA_HELP = ("measured-data root holding aiconfigurator/ and vidur/, upstream layout such as ../shared/data "
              "(default: the copy shipped in sim/data/measured)")


_NUMERIC: Final = ("m", "n", "k", "batch_size", "seq_len", "kv_len", "num_heads", "num_kv_heads", "head_dim",
                   "window_size", "num_gpus", "message_bytes", *sorted(TABLE_NUMERIC))
_REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("m", "n", "k"), "context_attention": ("batch_size", "seq_len", "num_heads", "head_dim"),
    "generation_attention": ("batch_size", "kv_len", "num_heads", "head_dim"),
    **dict.fromkeys(("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_alltoall",
                     "custom_allreduce"), ("num_gpus", "message_bytes")),
    **dict.fromkeys(("norm", "elementwise", "embedding", "sampling"), ("m", "n")),
    **{t: tuple(c for c in cols if c in TABLE_NUMERIC or c in _NUMERIC) for t, cols in TABLE_REQUIRED.items()},
}
"""Numeric cells each kernel needs (integers >= 1); the fast path checks them before predicting."""
_MODEL_TEXT: Final = ("kernel", "backend", "dtype", "attn_dtype", "kv_cache_dtype", "variant", "kernel_source",
                      "moe_dtype", "distribution", "quant_type", "gemm_type", "bmm_dtype", "op_name")
_TABLE_TEXT_REQUIRED: Final = {t: tuple(c for c in cols if c not in TABLE_NUMERIC and c not in _NUMERIC)
                               for t, cols in TABLE_REQUIRED.items()}
"""Text cells a table-keyed row must fill (checked by the fast path; else the row-by-row reader names them)."""
"""Text columns the model reads (the others are only copied to the output)."""


def _columns(rows: list[list[str]], header: list[str]) -> dict[str, np.ndarray]:
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    return {h: np.array(c, dtype=object) for h, c in zip(header, cols, strict=True)}


def predict_columns(cols: dict[str, np.ndarray], hw: HardwareSpec, tier: str,
                    calibration: str | None) -> tuple[np.ndarray, np.ndarray, frozenset[str]]:
    """(latency s, provenance codes, families the model prices without a target-measured correction)."""
    if resolved_tier(hw, tier, calibration) != tier:
        sys.stderr.write(f"no calibration for {hw.name}: target-measured falls back to cross-generation\n")
        tier = "cross-generation"
    art = load_for_tier(hw, tier, calibration)  # type: ignore[arg-type]
    model = None if art is None else FittedEfficiency(art.families)
    latency, prov = predict_latency_s(cols, hw, model)
    return latency, prov, frozenset() if model is None else model.uncorrected_families()


def resolved_tier(hw: HardwareSpec, tier: str, calibration: str | None) -> str:
    """The tier `predict_columns` prices with (target-measured without any calibration falls back)."""
    if tier == "target-measured" and calibration is None and shipped_calibration(hw.name) is None:
        return "cross-generation"
    return tier


def interval_columns(cols: dict[str, np.ndarray], latency_s: np.ndarray, tier: str, sm_version: int | None = None,
                     plain_families: frozenset[str] = frozenset(), prov: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) seconds: the shipped split-conformal interval of each row's family in `tier` on a GPU
    of `sm_version` (its architecture class) (lo = hi = the prediction when no interval table ships).
    A target-measured row the correction did not reach (its family in `plain_families`, none for
    this GPU, or provenance `transferred`: its key is not a corrected one) is a cross-generation
    prediction and takes that tier's interval."""
    from sim.calibration.intervals import shipped_intervals
    from sim.calibration.tables import FAMILY_OF_KERNEL

    table = shipped_intervals()
    if table is None:
        return latency_s.copy(), latency_s.copy()
    families = np.array([FAMILY_OF_KERNEL.get(str(k), "") for k in cols["kernel"]], dtype=object)
    uncorrected = np.isin(families.astype(str), sorted(plain_families))
    if prov is not None:
        uncorrected |= prov == int(Provenance.TRANSFERRED)
    return table.bounds(tier, families, latency_s, sm_version, uncorrected)


def _read_header(src: Path) -> list[str]:
    with src.open(newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f), None)
    if not header or "kernel" not in header:
        raise ConfigError(source=str(src), key="kernel", value=None, rule="column is required")
    check_unique_columns(header, str(src))  # the model would read one copy and the output copy the other
    return header


def _read_fast(src: Path, header: list[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(text columns as Arrow arrays, model columns) via Arrow's CSV reader, or None when any cell
    needs the row-by-row reader (unparseable or invalid numbers, missing required cells)."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv
    except ImportError:
        return None
    try:
        table = pacsv.read_csv(
            src, read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),
            convert_options=pacsv.ConvertOptions(column_types={h: pa.string() for h in header},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except pa.ArrowInvalid:
        return None
    text = {h: table.column(h).combine_chunks() for h in header}
    cols: dict[str, np.ndarray] = {}
    null = pa.scalar(None, type=pa.string())
    try:
        for h in header:
            if h in _NUMERIC:
                c = text[h]
                num = pc.cast(pc.if_else(pc.equal(c, ""), null, c), pa.float64())
                if pc.any(pc.invert(pc.is_finite(num))).as_py():  # "nan", "inf": not blank, not valid
                    return None
                cols[h] = num.to_numpy(zero_copy_only=False)
            elif h in _MODEL_TEXT:
                cols[h] = text[h].to_numpy(zero_copy_only=False).astype(object)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if not _valid_numbers(cols):
        return None
    return text, cols


def _valid_numbers(cols: dict[str, np.ndarray]) -> bool:
    kernel = cols["kernel"]
    for name, required in _REQUIRED.items():
        sel = kernel == name
        if not sel.any():
            continue
        for c in required:
            v = cols.get(c)
            if v is None or not np.all((v[sel] >= 1) & (v[sel] == np.floor(v[sel]))):
                return False
    dist = cols.get("distribution")
    if dist is not None and not all(valid_distribution(str(d)) for d in set(dist.tolist())):
        return False  # the row-by-row reader names the cell
    topk, experts = cols.get("topk"), cols.get("num_experts")
    if topk is not None and experts is not None and np.any(topk > experts):  # (NaN: blank, compares false)
        return False
    for c in _NUMERIC:
        v = cols.get(c)
        if v is None:
            continue
        ok = np.isnan(v) | ((v == np.floor(v)) & (v >= (0 if c in ZERO_ALLOWED else 1)) & (v <= max_cell(c)))
        if not ok.all():
            return False
    for name, required in _TABLE_TEXT_REQUIRED.items():
        sel = kernel == name
        for c in required if sel.any() else ():
            v = cols.get(c)
            if v is None or bool((v[sel] == "").any()):
                return False
        if not sel.any():
            continue
        # The text levels the row-by-row reader checks (`table_row_work`): an unknown dtype or op
        # name would otherwise be priced as some default instead of being refused.
        for c in TABLE_COLUMNS[name]:
            levels = TABLE_LEVELS.get(f"{c}_{name}" if c == "op_name" else c)
            v = cols.get(c)
            if levels is not None and v is not None and not set(v[sel].tolist()) <= {"", *levels}:
                return False
        v = cols.get("kv_cache_dtype")
        if v is not None and not set(v[sel].tolist()) <= {"", *TABLE_KV_CACHE_DTYPES}:
            return False
    heads, kv = cols.get("num_heads"), cols.get("num_kv_heads")
    if heads is not None and kv is not None:
        both = ~np.isnan(heads) & ~np.isnan(kv)
        if np.any(np.mod(heads[both], kv[both]) != 0):
            return False
    return set(kernel.tolist()) <= set(_REQUIRED)


def _validate_rows(src: Path) -> tuple[list[str], list[list[str]]]:
    """Row-by-row reading: names the first malformed row and column (ConfigError)."""
    with src.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None) or []
        rows = [row for row in reader if row]  # blank lines hold no row (as Arrow's reader skips them)
    for number, row in enumerate(rows, start=1):
        if len(row) != len(header):  # a short or long row would shift or drop cells
            raise ConfigError(source=f"{src} row {number}", key="<columns>", value=len(row),
                              rule=f"has {len(row)} fields, the header has {len(header)}")
        row_to_work(dict(zip(header, row, strict=True)), number=number, source=str(src))
    return header, rows


def _six_significant(x: np.ndarray) -> np.ndarray:
    """`x` rounded to 6 significant digits (so the shortest decimal form is at most 6 digits)."""
    out = x.copy()
    finite = np.isfinite(x) & (x > 0)
    exp10 = np.zeros(len(x), dtype=int)
    exp10[finite] = np.floor(np.log10(x[finite])).astype(int)
    for e in set(exp10[finite].tolist()):
        sel = finite & (exp10 == e)
        out[sel] = np.round(x[sel], 5 - e)
    return out


def passthrough_columns(header: list[str]) -> list[str]:
    """Input columns the model does not read (an id, the measured `latency_ms` of a data table,
    ...), in input order: the output copies them after the table-keyed columns, before the
    interval's ends. An input column named as an output column is recomputed, not copied."""
    return [h for h in header if h not in ROW_COLUMNS and h not in PREDICTION_COLUMNS]


def _output_columns(extra: list[str]) -> list[str]:
    return [*PREDICTION_COLUMNS[:-len(INTERVAL_COLUMNS)], *extra, *INTERVAL_COLUMNS]


def _write_fast(out: Path, text: dict[str, Any], n: int, latency_s: np.ndarray, prov: np.ndarray,
                bounds: tuple[np.ndarray, np.ndarray], extra: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    labels = np.array([p.label() for p in sorted(Provenance)], dtype=object)
    blank = pa.array([""] * n, type=pa.string()) if any(c not in text for c in ROW_COLUMNS) else None
    arrays = [text.get(c, blank) for c in BASE_COLUMNS]
    arrays.append(pc.cast(pa.array(_six_significant(latency_s * 1e3)), pa.string()))
    arrays.append(pa.array(labels[prov], type=pa.string()))
    arrays += [text.get(c, blank) for c in TABLE_ROW_COLUMNS]
    arrays += [text[c] for c in extra]
    arrays += [pc.cast(pa.array(_six_significant(b * 1e3)), pa.string()) for b in bounds]
    pacsv.write_csv(pa.table(arrays, names=_output_columns(extra)), out,
                    write_options=pacsv.WriteOptions(quoting_style="needed"))


def _hardware_flag(name: str, verb: str) -> HardwareSpec:
    """`--hardware NAME`, an unknown name named as the flag it came from (not the scenario key)."""
    try:
        return load_hardware(name)
    except ConfigError as exc:
        if exc.key != "hardware.name":
            raise
        raise ConfigError(source=verb, key="--hardware", value=name, rule=exc.rule) from None


def cmd_predict_kernels(args: Namespace) -> int:
    hw = _hardware_flag(args.hardware, "predict-kernels")
    src = Path(args.input)
    try:
        header = _read_header(src)
        fast = _read_fast(src, header)
        rows: list[list[str]] = []
        if fast is not None:
            text, cols = fast
            n = len(cols["kernel"])
        else:
            header, rows = _validate_rows(src)
            cols, n = _columns(rows, header), len(rows)
    except OSError as exc:
        raise file_error(exc, path=src, key="--in") from None
    except UnicodeDecodeError as exc:
        raise decode_error(exc, path=src, what="kernel-row CSV") from None
    except csv.Error as exc:
        raise ConfigError(source=str(src), key="--in", value=str(src), rule=f"malformed CSV: {exc}") from None
    try:
        latency_s, prov, plain_families = predict_columns(cols, hw, args.tier, args.calibration)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        _validate_rows(src)
        raise ConfigError(source=str(src), key="<rows>", value=None, rule=str(exc)) from None
    tier = resolved_tier(hw, args.tier, args.calibration)
    bounds = interval_columns(cols, latency_s, tier, hw.sm_version, plain_families, prov)
    out = Path(args.out)
    try:
        _write_predictions(out, fast is not None, text if fast is not None else {}, header, rows, n,
                           latency_s, prov, bounds)
    except OSError as exc:
        raise file_error(exc, path=out, key="--out", writing=True) from None
    sys.stderr.write(f"wrote {n} predictions ({tier}) to {out}\n")  # the tier priced with, after a fallback
    return 0


def _write_predictions(out: Path, fast: bool, text: dict[str, Any], header: list[str], rows: list[list[str]],
                       n: int, latency_s: np.ndarray, prov: np.ndarray,
                       bounds: tuple[np.ndarray, np.ndarray]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(out))
    tmp = out.with_suffix(out.suffix + ".tmp")
    try:
        passthrough = passthrough_columns(header)
        if fast:
            _write_fast(tmp, text, n, latency_s, prov, bounds, passthrough)
        else:
            labels = {int(p): p.label() for p in Provenance}
            pos = [header.index(c) if c in header else -1 for c in BASE_COLUMNS]
            table_pos = [header.index(c) if c in header else -1 for c in TABLE_ROW_COLUMNS]
            copied = [header.index(c) for c in passthrough]
            with tmp.open("w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(_output_columns(passthrough))
                for row, t, p, lo, hi in zip(rows, latency_s.tolist(), prov.tolist(), bounds[0].tolist(),
                                             bounds[1].tolist(), strict=True):
                    writer.writerow([row[i] if i >= 0 else "" for i in pos] + [f"{t * 1e3:.6g}", labels[p]]
                                    + [row[i] if i >= 0 else "" for i in table_pos] + [row[i] for i in copied]
                                    + [f"{lo * 1e3:.6g}", f"{hi * 1e3:.6g}"])
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no partial file behind


def cmd_calibrate(args: Namespace) -> int:
    from sim.calibration.bridge import default_reference_gpu, load_reference
    from sim.calibration.calibrate import calibrate_dir
    from sim.measured import measured_data_root

    hw = _hardware_flag(args.hardware, "calibrate")
    directory = Path(args.microbench)
    if not directory.is_dir():
        raise ConfigError(source="calibrate", key="--microbench", value=str(directory), rule="must be a directory")
    out = Path(args.out)
    if out.is_dir():  # checked before the fit, not after it
        raise ConfigError(source="calibrate", key="--out", value=str(out), rule="is a directory; name a .json file")
    prepare_out_file(out)  # an unwritable --out fails now, not after the fit and the bridge (~15 s)
    base = load_artifact(args.base or CALIBRATION_DIR / CROSS_GENERATION_FILE)
    reference = None
    if not args.no_bridge:
        ref_gpu = args.reference_hardware or default_reference_gpu(hw.name)
        ref_dir = Path(args.reference_microbench) if args.reference_microbench else None
        if ref_dir is not None and not ref_dir.is_dir():
            raise ConfigError(source="calibrate", key="--reference-microbench", value=str(ref_dir),
                              rule="must be a directory written by `kernelsight microbench run`")
        reference = load_reference(measured_data_root(), ref_gpu, ref_dir)
    art = calibrate_dir(hw, directory, base, allow_dry_run=args.allow_dry_run, reference=reference)
    try:
        art.save(out)
    except OSError as exc:
        raise file_error(exc, path=out, key="--out", writing=True) from None
    sys.stderr.write(f"wrote target-measured calibration of {hw.name} to {out}: {art.notes}\n")
    return 0


def _plan_latency(hw: HardwareSpec) -> Any:
    def latency(rows: list[dict[str, str]]) -> list[float]:
        cols = {c: np.array([r[c] for r in rows], dtype=object) for c in ROW_COLUMNS}
        t, _, _ = predict_columns(cols, hw, "cross-generation", None)
        return [float(v) for v in t]
    return latency


def cmd_microbench_plan(args: Namespace) -> int:
    hw = _hardware_flag(args.hardware, "microbench plan")
    if args.out is not None:
        prepare_out_file(Path(args.out))
    rows = microbench_plan(hw)
    gpu_s = estimate_gpu_s(rows, _plan_latency(hw))
    if len(rows) > MAX_POINTS or gpu_s > MAX_GPU_S:
        raise ConfigError(source="microbench plan", key="budget", value=(len(rows), gpu_s),
                          rule=f"plan exceeds {MAX_POINTS} points or {MAX_GPU_S:.0f} GPU-s")
    if args.out is None:
        writer = csv.DictWriter(sys.stdout, fieldnames=list(ROW_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    else:
        try:
            with Path(args.out).open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(ROW_COLUMNS))
                writer.writeheader()
                writer.writerows(rows)
        except OSError as exc:
            raise file_error(exc, path=args.out, key="--out", writing=True) from None
    sys.stderr.write(f"{len(rows)} points, estimated {gpu_s / 60:.1f} GPU-minutes on {hw.name}\n")
    return 0


def data_root(arg: str | None) -> Path:
    """`--data`, else the measured data shipped in the package (sim/data/measured)."""
    root = Path(arg) if arg else measured_data_root()
    if (root / "aiconfigurator").is_dir():
        return root
    raise ConfigError(source="accuracy", key="--data", value=arg, rule="must hold aiconfigurator/ and vidur/")


def cmd_fit_cross_generation(args: Namespace) -> int:
    from sim.calibration.accuracy import TRAIN_GPUS
    from sim.calibration.calibrate import cross_generation_artifact, shipped_calibration_artifact

    root = data_root(args.data)
    if args.calibrations_only:
        art = load_artifact(args.out)
        sys.stderr.write(f"read cross-generation model fitted on {', '.join(art.fitted_on)} from {args.out}\n")
    else:
        art = cross_generation_artifact(root)
        art.save(Path(args.out))
        sys.stderr.write(f"wrote cross-generation model fitted on {', '.join(art.fitted_on)} to {args.out}\n")
    if args.calibrations or args.calibrations_only:
        for gpu in TRAIN_GPUS:
            cal = shipped_calibration_artifact(root, gpu, art)
            path = Path(args.out).parent / f"{gpu}.json"
            cal.save(path)
            sys.stderr.write(f"wrote target-measured calibration of {gpu} to {path}\n")
    return 0


def register(sub: Any) -> None:
    """Add this module's verbs to the `kernelsight` sub-parser collection."""
    pk = sub.add_parser("predict-kernels", help="predict kernel latencies for rows of a CSV")
    pk.add_argument("--hardware", required=True)
    pk.add_argument("--tier", default="roofline", choices=("roofline", "cross-generation", "target-measured"))
    pk.add_argument("--calibration", help="calibration artifact JSON (default: the shipped one)")
    pk.add_argument("--in", dest="input", required=True, metavar="ROWS.csv")
    pk.add_argument("--out", required=True, metavar="PRED.csv")
    pk.set_defaults(func=cmd_predict_kernels)

    cal = sub.add_parser("calibrate", help="fit a target-measured calibration from microbenchmark tables")
    cal.add_argument("--hardware", required=True)
    cal.add_argument("--microbench", required=True, metavar="DIR")
    cal.add_argument("--out", required=True, metavar="CAL.json")
    cal.add_argument("--base", help="cross-generation artifact to correct (default: the shipped one)")
    cal.add_argument("--reference-hardware", metavar="GPU",
                     help="the GPU whose tables bridge ours to the serving frameworks' kernels (default: h100_sxm, "
                          "h200_sxm for an h100_sxm target; docs/kernel-model.md)")
    cal.add_argument("--reference-microbench", metavar="DIR",
                     help="our tables of the reference GPU (default: the shipped sim/data/microbench/<gpu>/)")
    cal.add_argument("--no-bridge", action="store_true",
                     help="fit on our rows as measured (bare torch kernels; the correction then moves every "
                          "framework's prediction by the torch residual)")
    cal.add_argument("--allow-dry-run", action="store_true",
                     help="accept a `microbench run --dry-run` directory (to try the pipeline without a GPU: "
                          "its times, and so the calibration, mean nothing)")
    cal.set_defaults(func=cmd_calibrate)

    mb = sub.add_parser("microbench", help="the model-agnostic microbenchmark sweep")
    mb_sub = mb.add_subparsers(dest="microbench_verb", required=True)
    plan = mb_sub.add_parser("plan", help="write the sweep's kernel points (predict-kernels rows)")
    plan.add_argument("--hardware", required=True)
    plan.add_argument("--out", metavar="PLAN.csv")
    plan.set_defaults(func=cmd_microbench_plan)
    from orchestrator.microbench.cli import register_run

    register_run(mb_sub)  # microbench run, microbench compare

    fx = sub.add_parser("fit-cross-generation", help="refit the shipped cross-generation model")
    fx.add_argument("--data", help=DATA_HELP)
    fx.add_argument("--out", default=str(CALIBRATION_DIR / CROSS_GENERATION_FILE))
    fx.add_argument("--calibrations", action="store_true",
                    help="also refit the shipped target-measured calibrations of the training GPUs "
                         "(on their microbench-plan points), next to --out")
    fx.add_argument("--calibrations-only", action="store_true",
                    help="refit only the target-measured calibrations, against the cross-generation model "
                         "already at --out (after a plan or correction change)")
    fx.set_defaults(func=cmd_fit_cross_generation)
