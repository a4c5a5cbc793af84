"""One measured (or skipped) plan point: the `points.csv` row every output table is rendered from.

`points.csv` is appended and flushed after each point, so an interrupted run keeps what it
measured and `--resume` continues from it. Columns: the plan row (`ROW_COLUMNS`, with backend,
backend_version, kernel_source and variant filled in by the measurement), status (`measured`,
`skipped` = no implementation here can run it, `failed` = an implementation raised), the reason,
latency median and p10/p90 over repeats (ms), calls per timed loop, repeats, rotation copies,
timing method, the wall time spent on the point including setup (s), and `parts`: the measured
parts of a point whose table splits its latency (DeepEP: `dispatch_latency_ms=...;combine_latency_ms=...`).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TextIO

from orchestrator.microbench.timing import Measurement
from sim.calibration.rows import ROW_COLUMNS

Status = Literal["measured", "skipped", "failed"]
POINT_COLUMNS: Final[tuple[str, ...]] = (
    "number", "key", "status", "reason", *ROW_COLUMNS, "latency_ms", "p10_ms", "p90_ms", "calls_per_repeat",
    "repeats", "copies", "timing", "wall_s", "parts")
POINTS_FILE: Final = "points.csv"


@dataclass(frozen=True, slots=True, kw_only=True)
class PointRecord:
    number: int
    key: str
    status: Status
    reason: str
    row: Mapping[str, str]
    """The plan row with the implementation's backend labels filled in."""
    measurement: Measurement | None = None
    copies: int = 0
    wall_s: float = 0.0
    parts_ms: Mapping[str, float] = field(default_factory=dict)
    """Table columns of the latency's parts, in ms (DeepEP's dispatch and combine); empty elsewhere."""

    def latency_ms(self) -> float:
        if self.measurement is None:
            raise ValueError(f"point {self.key} was not measured ({self.status}: {self.reason})")
        return self.measurement.median_s * 1e3

    def to_csv_row(self) -> dict[str, str]:
        m = self.measurement
        out = {"number": str(self.number), "key": self.key, "status": self.status, "reason": self.reason,
               **{c: self.row.get(c, "") for c in ROW_COLUMNS},
               "latency_ms": "", "p10_ms": "", "p90_ms": "", "calls_per_repeat": "", "repeats": "",
               "copies": str(self.copies) if self.copies else "", "timing": "", "wall_s": f"{self.wall_s:.4g}",
               "parts": ";".join(f"{k}={v:.6g}" for k, v in self.parts_ms.items())}
        if m is not None:
            out.update(latency_ms=_ms(m.median_s), p10_ms=_ms(m.p10_s), p90_ms=_ms(m.p90_s),
                       calls_per_repeat=str(m.calls_per_repeat), repeats=str(m.repeats), timing=m.timing)
            if m.note:
                out["reason"] = m.note
        return out

    @classmethod
    def from_csv_row(cls, d: Mapping[str, str]) -> PointRecord:
        status = d["status"]
        if status not in ("measured", "skipped", "failed"):
            raise ValueError(f"status={status!r}")
        m = None
        if status == "measured":
            m = Measurement(median_s=float(d["latency_ms"]) * 1e-3, p10_s=float(d["p10_ms"]) * 1e-3,
                            p90_s=float(d["p90_ms"]) * 1e-3, calls_per_repeat=int(d["calls_per_repeat"]),
                            repeats=int(d["repeats"]), timing=d["timing"], note=d["reason"])
        return cls(number=int(d["number"]), key=d["key"], status=status,  # type: ignore[arg-type]
                   reason=d["reason"], row={c: d.get(c, "") for c in ROW_COLUMNS}, measurement=m,
                   copies=int(d["copies"] or 0), wall_s=float(d["wall_s"] or 0.0),
                   parts_ms=parse_parts(d.get("parts") or ""))


def parse_parts(text: str) -> dict[str, float]:
    """`a=1.5;b=2` -> {"a": 1.5, "b": 2.0} (the `parts` column)."""
    out: dict[str, float] = {}
    for item in filter(None, text.split(";")):
        name, _, value = item.partition("=")
        out[name.strip()] = float(value)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.6g}"


def read_points(path: Path) -> list[PointRecord]:
    with path.open(newline="") as f:
        return [PointRecord.from_csv_row(d) for d in csv.DictReader(f)]


class PointsLog:
    """Append-only points.csv writer; each record is flushed as soon as it exists."""

    def __init__(self, path: Path, *, append: bool) -> None:
        existed = append and path.is_file() and path.stat().st_size > 0
        self._file: TextIO = path.open("a" if append else "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=list(POINT_COLUMNS))
        if not existed:
            self._writer.writeheader()
            self._file.flush()

    def write(self, record: PointRecord) -> None:
        self._writer.writerow(record.to_csv_row())
        self._file.flush()

    def close(self) -> None:
        self._file.close()
