"""Request traces and token-count datasets from CSV or JSONL files.

Each row gives one request's input and output token counts, optionally its arrival time and a
shared prefix. Accepted column (CSV) or key (JSONL) names, first match wins:

- input tokens: `input_tokens`, `input_toks`, `prompt_tokens`, `prompt_len`
- output tokens: `output_tokens`, `output_toks`, `output_len`
- arrival, seconds: `arrival_s`, `arrival_rel_s`, `arrival_time`, `timestamp`; or
  `arrival_time_ns` in nanoseconds (LLMServingSim's JSONL)
- `prefix_group` (int >= 0) and `prefix_tokens` (shared prefix length within the input)
- `run_id`, to select one run of a file that holds several

Other columns are ignored. Either every row has an arrival time or none does; arrivals must be
non-decreasing in file order. With `max_model_len` given, a replayed row whose input plus output
tokens exceed it is an error, as vLLM's OpenAI server rejects such a request (it never runs).
Errors name `<path> row <n>`, where n counts data rows from 1 (the CSV header is not a row) for
CSV and lines from 1 for JSONL; errors about the run selection name `workload.dataset_run_id`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from sim.errors import ConfigError
from sim.serde import FieldError, check_unique_columns, require
from sim.specs.workload import WorkloadSpec
from sim.workload.arrivals import sample_arrivals_s
from sim.workload.requests import MAX_PREFIX_GROUP, RequestSpec, build_requests

INPUT_KEYS: Final = ("input_tokens", "input_toks", "prompt_tokens", "prompt_len")
OUTPUT_KEYS: Final = ("output_tokens", "output_toks", "output_len")
ARRIVAL_S_KEYS: Final = ("arrival_s", "arrival_rel_s", "arrival_time", "timestamp")
ARRIVAL_NS_KEY: Final = "arrival_time_ns"
PREFIX_GROUP_KEY: Final = "prefix_group"
PREFIX_TOKENS_KEY: Final = "prefix_tokens"
RUN_ID_KEY: Final = "run_id"
DATASET_RUN_ID_KEY: Final = "workload.dataset_run_id"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRow:
    """One request of a trace file, before arrival times are settled."""

    input_tokens: int
    """Prompt length, shared prefix included."""
    output_tokens: int
    arrival_s: float | None = None
    """As written in the file (not yet shifted to start at 0); None when the file has none."""
    prefix_group: int = -1
    """-1 when the prompt shares no prefix."""
    prefix_tokens: int = 0
    """Leading input tokens shared with every row of `prefix_group`."""
    row: int = field(default=0, compare=False)
    """Where it is in the file (`<path> row <n>` of the errors); 0 when not read from a file."""

    def __post_init__(self) -> None:
        require(self.input_tokens >= 1, "input_tokens", self.input_tokens, "must be >= 1")
        require(self.output_tokens >= 1, "output_tokens", self.output_tokens, "must be >= 1")
        require(self.arrival_s is None or (math.isfinite(self.arrival_s) and self.arrival_s >= 0), "arrival_s",
                self.arrival_s, "must be a finite number >= 0 (seconds from the trace's start)")
        require(-1 <= self.prefix_group < MAX_PREFIX_GROUP, "prefix_group", self.prefix_group,
                f"must be in [0, {MAX_PREFIX_GROUP}) (or absent)")
        require(0 <= self.prefix_tokens <= self.input_tokens, "prefix_tokens", self.prefix_tokens,
                f"must be in [0, input_tokens={self.input_tokens}]")
        require(self.prefix_tokens == 0 or self.prefix_group >= 0, "prefix_tokens",
                self.prefix_tokens, "needs a prefix_group")


def read_trace(path: str | Path, *, run_id: str | None = None) -> tuple[TraceRow, ...]:
    """Rows of a `.csv` or `.jsonl` trace, in file order.

    `run_id` keeps only the rows of that run; a file whose `run_id` column names several runs
    must be given one, so runs are never mixed silently.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise ConfigError(source=str(path), key="<file>", value=path.name,
                          rule="trace files must end in .csv or .jsonl")
    try:
        with path.open(newline="" if suffix == ".csv" else None, encoding="utf-8") as f:
            records = _csv_records(f, path) if suffix == ".csv" else _jsonl_records(f, path)
            return _rows(records, path, run_id)
    except FileNotFoundError:
        raise ConfigError(source=str(path), key="<file>", value=str(path),
                          rule="file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(source=str(path), key="<file>", value=str(path),
                          rule=f"not UTF-8 text: {exc}") from None


def requests_from_trace(
    rows: tuple[TraceRow, ...], spec: WorkloadSpec, rng: np.random.Generator, *,
    max_model_len: int | None = None,
) -> tuple[RequestSpec, ...]:
    """The first `spec.num_prompts` rows as requests.

    Arrival times from the file are used, shifted so the first request arrives at 0, and
    `request_rate`/`burstiness` are ignored; without them arrivals are sampled as for synthetic
    workloads. `random_*` length settings do not apply to traces. With `max_model_len`, a row
    whose input plus output tokens exceed it raises `ConfigError` (vLLM rejects the request).
    """
    n = spec.num_prompts
    source = spec.dataset_path or "<trace>"
    if len(rows) < n:
        raise ConfigError(source=source, key="num_prompts", value=n,
                          rule=f"the trace has only {len(rows)} rows")
    rows = rows[:n]
    if max_model_len is not None:
        check_lengths(rows, max_model_len, source)
    timed = [r.arrival_s is not None for r in rows]
    if all(timed):
        arrivals_s = np.array([r.arrival_s for r in rows], dtype=np.float64)
        if np.any(np.diff(arrivals_s) < 0):
            bad = int(np.argmax(np.diff(arrivals_s) < 0)) + 1
            raise ConfigError(source=f"{source} row {bad + 1}", key="arrival_s",
                              value=float(arrivals_s[bad]), rule="arrivals must be non-decreasing")
        arrivals_s = arrivals_s - arrivals_s[0]
    elif any(timed):
        missing = timed.index(False)
        raise ConfigError(source=f"{source} row {missing + 1}", key="arrival_s", value=None,
                          rule="missing while other rows have arrival times")
    else:
        arrivals_s = sample_arrivals_s(n, spec.request_rate, spec.burstiness, rng)
    return build_requests(
        arrivals_s=arrivals_s,
        prompt_tokens=np.array([r.input_tokens for r in rows], dtype=np.int64),
        output_tokens=np.array([r.output_tokens for r in rows], dtype=np.int64),
        prefix_groups=np.array([r.prefix_group for r in rows], dtype=np.int64),
        prefix_tokens=np.array([r.prefix_tokens for r in rows], dtype=np.int64),
    )


def check_lengths(rows: tuple[TraceRow, ...], max_model_len: int, source: str) -> None:
    """Raise `ConfigError` for the first row whose input plus output tokens exceed `max_model_len`.

    vLLM's OpenAI server rejects a request when prompt + max_tokens > max_model_len (and its engine
    cannot hold a longer sequence), so replaying such a row would simulate a request that never ran.
    """
    for i, row in enumerate(rows):
        total = row.input_tokens + row.output_tokens
        if total > max_model_len:
            where = f"{source} row {row.row}" if row.row else source
            raise ConfigError(
                source=where, key="input_tokens+output_tokens", value=total,
                rule=f"request {i} asks for {row.input_tokens} prompt + {row.output_tokens} output tokens, "
                f"over engine.max_model_len={max_model_len} (vLLM rejects requests longer than "
                "max_model_len); raise engine.max_model_len or drop the row")


_Record = tuple[int, Mapping[str, object]]


def _csv_records(f: Iterator[str], path: Path) -> Iterator[_Record]:
    reader = csv.DictReader(f)
    if reader.fieldnames is None:
        raise ConfigError(source=str(path), key="<header>", value=None,
                          rule="the CSV file is empty")
    check_unique_columns(reader.fieldnames, str(path))
    for n, record in enumerate(reader, start=1):
        if None in record:
            raise ConfigError(source=f"{path} row {n}", key="<columns>", value=record[None],
                              rule="more fields than header columns")
        yield n, {k: v for k, v in record.items() if v is not None and v.strip() != ""}


def _jsonl_records(f: Iterator[str], path: Path) -> Iterator[_Record]:
    for n, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(source=f"{path} row {n}", key="<line>", value=line.strip()[:80],
                              rule=f"invalid JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise ConfigError(source=f"{path} row {n}", key="<line>", value=line.strip()[:80],
                              rule="must be a JSON object")
        if "sub_requests" in record:
            raise ConfigError(source=f"{path} row {n}", key="sub_requests", value="...",
                              rule="agentic sessions with chained sub-requests are not supported")
        yield n, {k: v for k, v in record.items() if v is not None}


def _rows(records: Iterator[_Record], path: Path, run_id: str | None) -> tuple[TraceRow, ...]:
    rows: list[TraceRow] = []
    run_ids: set[str] = set()
    timed_row: int | None = None
    untimed_row: int | None = None
    previous_arrival_s = -math.inf
    for n, record in records:
        source = f"{path} row {n}"
        if RUN_ID_KEY in record:
            row_run = str(record[RUN_ID_KEY])
            run_ids.add(row_run)
            # Rows of other runs are not parsed; with no run chosen, a second run only
            # collects the run ids for the error below.
            if (run_id is not None and row_run != run_id) or (run_id is None and len(run_ids) > 1):
                continue
        elif run_id is not None:
            raise ConfigError(source=source, key=RUN_ID_KEY, value=None,
                              rule=f"missing, so {DATASET_RUN_ID_KEY}={run_id!r} cannot be selected")
        row = _row(record, source, n)
        if row.arrival_s is None:
            untimed_row = untimed_row or n
        else:
            timed_row = timed_row or n
            if row.arrival_s < previous_arrival_s:
                raise ConfigError(source=source, key=_arrival_key(record) or "arrival_s",
                                  value=row.arrival_s,
                                  rule=f"arrivals must be non-decreasing; the previous row has "
                                  f"{previous_arrival_s}")
            previous_arrival_s = row.arrival_s
        if timed_row is not None and untimed_row is not None:
            raise ConfigError(source=f"{path} row {max(timed_row, untimed_row)}",
                              key="arrival_s", value=None,
                              rule=f"rows {min(timed_row, untimed_row)} and "
                              f"{max(timed_row, untimed_row)} disagree on having an arrival time")
        rows.append(row)
    if run_id is None and len(run_ids) > 1:
        raise ConfigError(source=str(path), key=DATASET_RUN_ID_KEY, value=None,
                          rule=f"the file holds {len(run_ids)} runs; choose one of "
                          f"{', '.join(sorted(run_ids))}")
    if not rows:
        if run_id is not None:
            raise ConfigError(source=str(path), key=DATASET_RUN_ID_KEY, value=run_id,
                              rule="no rows of this run; the file has "
                              f"{', '.join(sorted(run_ids)) or 'no run_id values'}")
        raise ConfigError(source=str(path), key="<rows>", value=0, rule="the trace has no rows")
    return tuple(rows)


def _row(record: Mapping[str, object], source: str, n: int) -> TraceRow:
    input_key = _first_key(record, INPUT_KEYS, source, required=True)
    output_key = _first_key(record, OUTPUT_KEYS, source, required=True)
    assert input_key is not None and output_key is not None
    arrival_s: float | None = None
    arrival_key = _arrival_key(record)
    if arrival_key is not None:
        arrival_s = _as_float(record[arrival_key], source, arrival_key)
        if arrival_key == ARRIVAL_NS_KEY:
            arrival_s *= 1e-9
    group = record.get(PREFIX_GROUP_KEY)
    prefix = record.get(PREFIX_TOKENS_KEY)
    try:
        return TraceRow(
            input_tokens=_as_int(record[input_key], source, input_key),
            output_tokens=_as_int(record[output_key], source, output_key),
            arrival_s=arrival_s,
            prefix_group=-1 if group is None else _as_int(group, source, PREFIX_GROUP_KEY),
            prefix_tokens=0 if prefix is None else _as_int(prefix, source, PREFIX_TOKENS_KEY),
            row=n,
        )
    except FieldError as exc:
        key = {"input_tokens": input_key, "output_tokens": output_key,
               "arrival_s": arrival_key}.get(exc.key) or exc.key
        raise ConfigError(source=source, key=key, value=exc.value, rule=exc.rule) from None


def _arrival_key(record: Mapping[str, object]) -> str | None:
    return _first_key(record, (*ARRIVAL_S_KEYS, ARRIVAL_NS_KEY), "", required=False)


def _first_key(record: Mapping[str, object], keys: tuple[str, ...], source: str, *,
               required: bool) -> str | None:
    for key in keys:
        if key in record:
            return key
    if required:
        raise ConfigError(source=source, key=keys[0], value=None,
                          rule=f"missing; give one of {', '.join(keys)}")
    return None


_MAX_INT: Final = 2**53
"""Largest integer a trace field may hold: exact as a float and far above any length or group id
(a larger one is a typo, and would overflow the int64 arrays the requests are built from)."""


def _as_int(value: object, source: str, key: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(source=source, key=key, value=value, rule="must be an integer")
    if isinstance(value, int):
        number = value
    else:
        as_float = _as_float(value, source, key)
        if not as_float.is_integer():
            raise ConfigError(source=source, key=key, value=value, rule="must be an integer")
        number = int(as_float)
    if abs(number) > _MAX_INT:
        raise ConfigError(source=source, key=key, value=value, rule=f"must be an integer of at most {_MAX_INT:,}")
    return number


def _as_float(value: object, source: str, key: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(source=source, key=key, value=value, rule="must be a number")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(source=source, key=key, value=value,
                              rule="must be a number") from None
    else:
        raise ConfigError(source=source, key=key, value=value, rule="must be a number")
    if not math.isfinite(number):
        raise ConfigError(source=source, key=key, value=value, rule="must be a finite number")
    return number
