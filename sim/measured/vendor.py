"""Regenerate or check the vendored measured data (sim/data/measured) from the upstream snapshot.

    python -m sim.measured.vendor [--upstream ../shared/data]   # rewrite what changed, then the manifest
    python -m sim.measured.vendor --check [--upstream DIR]      # verify checksums, exit 1 on a mismatch

Every selected upstream table is stored as `<table>.csv.xz` (xz preset 9e of the upstream CSV text,
byte for byte; gzip is undone first), and its text files (README, SOURCES) verbatim. A table whose
vendored text already equals upstream is not rewritten, so a rerun with another liblzma leaves git
clean. MANIFEST.json lists each file: vendored path, upstream path, upstream sha256 (file as stored
upstream), text sha256 (decompressed CSV), vendored sha256, rows, bytes.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import lzma
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from sim.measured.files import MANIFEST_FILE, VENDORED_SUFFIX, content_sha256, measured_data_root, read_text_bytes

DEFAULT_UPSTREAM: Final = Path("../shared/data")
SYSTEMS: Final = ("a100_sxm", "b200_sxm", "h100_sxm", "h200_sxm", "l40s", "rtx_pro_6000_server")
"""AIConfigurator systems with measured tables; every table of each is vendored (b200_sxm for
evaluation only: nothing is fitted or tuned on it)."""
SINGLE_FILES: Final = (
    "aiconfigurator/gpu_specs.csv",          # tests: hardware TOMLs carry its numbers
    "aiconfigurator/sources.csv",            # provenance of every AIConfigurator table
    "e2e/aiconfigurator_silicon_sample.csv",  # validate: AIConfigurator closed-loop rows
    "e2e/llmservingsim_vllm_traces/runs.csv",  # validate; tests (KV blocks)
    "e2e/llmservingsim_vllm_traces/requests.csv",  # validate; tests (traces)
    "e2e/trtllm_perf_overview_throughput.csv",  # validate
    "e2e/trtllm_static_batch_v0.9.csv",      # validate
    "vidur/compute_mlp_ops.csv.gz",          # calibration: pointwise kernels
    "vidur/cpu_overheads_a100.csv",          # python -m sim.perf.host_fit
    "vidur/cpu_overheads_a40.csv",           # python -m sim.perf.host_fit
    "vidur/sources.csv",                     # provenance of the Vidur tables
)
VERBATIM: Final = {"README.md": "UPSTREAM_README.md", "SOURCES.md": "SOURCES.md"}
"""Upstream text files copied unchanged: upstream name -> vendored name."""
XZ_PRESET: Final = 9 | lzma.PRESET_EXTREME


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    path: str
    upstream_path: str
    upstream_sha256: str
    text_sha256: str
    vendored_sha256: str
    rows: int | None
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "upstream_path": self.upstream_path, "upstream_sha256": self.upstream_sha256,
                "text_sha256": self.text_sha256, "vendored_sha256": self.vendored_sha256, "rows": self.rows,
                "bytes": self.bytes}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def vendored_name(upstream_rel: str) -> str:
    """`aiconfigurator/h100_sxm/gemm.csv.gz` -> `aiconfigurator/h100_sxm/gemm.csv.xz`."""
    for suffix in (".csv.gz", ".csv"):
        if upstream_rel.endswith(suffix):
            return upstream_rel[: -len(suffix)] + VENDORED_SUFFIX
    return VERBATIM.get(upstream_rel, upstream_rel)


def selection(upstream: Path) -> list[str]:
    """Upstream paths (relative) of everything vendored."""
    picked = [f"aiconfigurator/{s}/{p.name}" for s in SYSTEMS
              for p in sorted((upstream / "aiconfigurator" / s).glob("*.csv*"))]
    return [*picked, *SINGLE_FILES, *VERBATIM]


def _count_rows(text: bytes) -> int:
    return sum(1 for _ in csv.reader(io.StringIO(text.decode("utf-8"), newline=""))) - 1


def vendor(upstream: Path, out: Path, files: Sequence[str] | None = None, *, log: TextIO = sys.stderr) -> list[Entry]:
    """Bring `out` up to date with `files` of `upstream` (default `selection`); returns the
    manifest entries (also written). Files under `out` no longer selected are removed."""
    entries: list[Entry] = []
    for rel in selection(upstream) if files is None else files:
        src = upstream / rel
        raw = src.read_bytes()
        dst = out / vendored_name(rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel in VERBATIM:
            if not dst.is_file() or dst.read_bytes() != raw:
                dst.write_bytes(raw)
            entries.append(Entry(path=vendored_name(rel), upstream_path=rel, upstream_sha256=_sha256(raw),
                                 text_sha256=_sha256(raw), vendored_sha256=_sha256(raw), rows=None, bytes=len(raw)))
            continue
        text = read_text_bytes(src)
        text_sha = _sha256(text)
        if not dst.is_file() or content_sha256(dst) != text_sha:
            log.write(f"compressing {rel} ({len(text) / 1e6:.1f} MB)\n")
            dst.write_bytes(lzma.compress(text, preset=XZ_PRESET))
        packed = dst.read_bytes()
        entries.append(Entry(path=vendored_name(rel), upstream_path=rel, upstream_sha256=_sha256(raw),
                             text_sha256=text_sha, vendored_sha256=_sha256(packed), rows=_count_rows(text),
                             bytes=len(packed)))
    stale = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {e.path for e in entries}
    for rel in sorted(stale - {MANIFEST_FILE, "README.md"}):
        log.write(f"removing {rel} (no longer selected)\n")
        (out / rel).unlink()
    manifest = {"upstream": "../shared/data (see SOURCES.md for the repositories and commits)",
                "format": f"tables: upstream CSV text, xz preset 9e ({VENDORED_SUFFIX}); text files verbatim",
                "total_bytes": sum(e.bytes for e in entries),
                "files": [e.to_json() for e in entries]}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return entries


def load_manifest(root: Path) -> list[dict[str, Any]]:
    files: list[dict[str, Any]] = json.loads((root / MANIFEST_FILE).read_text())["files"]
    return files


def check(root: Path, upstream: Path | None, *, text: bool = False) -> list[str]:
    """Mismatches between the manifest and the vendored files (and upstream, when given). `text`
    also decompresses each table and checks its CSV text sha256 (slower): vendored and upstream
    text equal means any reader gets the same rows from either."""
    problems: list[str] = []
    files = load_manifest(root)
    listed = {f["path"] for f in files}
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {MANIFEST_FILE, "README.md"}
    problems += [f"{p}: on disk but not in {MANIFEST_FILE}" for p in sorted(on_disk - listed)]
    for f in files:
        path = root / f["path"]
        if not path.is_file():
            problems.append(f"{f['path']}: missing")
            continue
        if _sha256(path.read_bytes()) != f["vendored_sha256"]:
            problems.append(f"{f['path']}: vendored sha256 differs from {MANIFEST_FILE}")
        if text and content_sha256(path) != f["text_sha256"]:
            problems.append(f"{f['path']}: text sha256 differs from {MANIFEST_FILE}")
        if upstream is not None:
            src = upstream / f["upstream_path"]
            if not src.is_file():
                problems.append(f"{f['upstream_path']}: missing upstream")
            elif _sha256(src.read_bytes()) != f["upstream_sha256"]:
                problems.append(f"{f['upstream_path']}: upstream changed; rerun python -m sim.measured.vendor")
            elif text and content_sha256(src) != f["text_sha256"]:
                problems.append(f"{f['upstream_path']}: upstream text sha256 differs from {MANIFEST_FILE}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.measured.vendor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", type=Path, default=DEFAULT_UPSTREAM, help="upstream data root (../shared/data)")
    ap.add_argument("--out", type=Path, default=measured_data_root(), help="vendored root (sim/data/measured)")
    ap.add_argument("--check", action="store_true", help="only verify checksums (upstream too when present)")
    args = ap.parse_args(argv)
    if args.check:
        problems = check(args.out, args.upstream if args.upstream.is_dir() else None, text=True)
        for p in problems:
            sys.stderr.write(p + "\n")
        return 1 if problems else 0
    if not (args.upstream / "aiconfigurator").is_dir():
        sys.stderr.write(f"{args.upstream}: not an upstream data root (no aiconfigurator/)\n")
        return 2
    entries = vendor(args.upstream, args.out)
    sys.stderr.write(f"{len(entries)} files, {sum(e.bytes for e in entries) / 1e6:.1f} MB in {args.out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
