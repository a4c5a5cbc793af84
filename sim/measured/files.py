"""Locating and opening measured tables: plain, gzip- or xz-compressed CSV, by upstream name."""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
from importlib import resources
from pathlib import Path
from typing import Final, TextIO

VENDORED_SUFFIX: Final = ".csv.xz"
"""Suffix of a vendored table: the upstream CSV text, xz-compressed."""
MANIFEST_FILE: Final = "MANIFEST.json"
_CSV_SUFFIXES: Final = (".csv.gz", ".csv.xz", ".csv")


def measured_data_root() -> Path:
    """The vendored copy shipped in the package (sim/data/measured), upstream layout."""
    return Path(str(resources.files("sim") / "data" / "measured"))


def table_name(path: Path) -> str:
    """`gemm.csv.gz`, `gemm.csv.xz` and `gemm.csv` all name the table `gemm.csv`."""
    name = path.name
    for suffix in _CSV_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".csv"
    return name


def resolve(path: Path) -> Path:
    """`path` when it exists, else the same table in another compression next to it (the
    vendored `<table>.csv.xz` for an upstream `<table>.csv.gz` or `<table>.csv`), else `path`
    unchanged so that the caller's missing-file error names what it asked for."""
    if path.exists():
        return path
    stem = table_name(path)[: -len(".csv")]
    for suffix in _CSV_SUFFIXES:
        other = path.with_name(stem + suffix)
        if other.exists():
            return other
    return path


def read_text_bytes(path: Path) -> bytes:
    """The CSV text of the table at `path` (after `resolve`), decompressed."""
    path = resolve(path)
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        return gzip.decompress(raw)
    if path.name.endswith(".xz"):
        return lzma.decompress(raw)
    return raw


def open_text(path: Path) -> TextIO:
    """The table at `path` (after `resolve`) as UTF-8 text for `csv` (newline translation off)."""
    path = resolve(path)
    if path.name.endswith((".gz", ".xz")):
        return io.TextIOWrapper(io.BytesIO(read_text_bytes(path)), encoding="utf-8", newline="")
    return path.open(newline="", encoding="utf-8")


def content_sha256(path: Path) -> str:
    """SHA-256 of the decompressed CSV text: equal for an upstream table and its vendored copy."""
    path = resolve(path)
    opener = gzip.open if path.name.endswith(".gz") else lzma.open if path.name.endswith(".xz") else open
    h = hashlib.sha256()
    with opener(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
