"""All validation rows of the e2e data directory, plus the data hash that fitting records."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from sim.errors import ConfigError
from sim.measured import read_text_bytes
from sim.perf.profile import EngineProfile
from sim.validation.aiconfigurator import FILE as AIC_FILE
from sim.validation.aiconfigurator import read_aiconfigurator
from sim.validation.finalize import finalize
from sim.validation.llmservingsim import DIR as LSS_DIR
from sim.validation.llmservingsim import read_llmservingsim
from sim.validation.rows import Source, ValidationRow
from sim.validation.specs_cache import SpecCache
from sim.validation.trtllm import STATIC_FILE, THROUGHPUT_FILE, read_trtllm_static, read_trtllm_throughput

DATA_FILES: tuple[str, ...] = (AIC_FILE, f"{LSS_DIR}/runs.csv", f"{LSS_DIR}/requests.csv", THROUGHPUT_FILE,
                               STATIC_FILE)
"""Files under the e2e directory that rows come from (hashed into fit provenance)."""


def data_sha256(e2e_dir: Path) -> str:
    """SHA-256 over (name, CSV text) of DATA_FILES: equal for upstream e2e/ and the vendored copy."""
    h = hashlib.sha256()
    for name in DATA_FILES:
        h.update(name.encode() + b"\0" + read_text_bytes(e2e_dir / name))
    return h.hexdigest()


def load_rows(e2e_dir: Path, profiles: Mapping[str, EngineProfile], *,
              sources: tuple[Source, ...] | None = None) -> list[ValidationRow]:
    """Every row of the selected sources, finalized (scenario checked; skipped rows keep their reason)."""
    if not e2e_dir.is_dir():
        raise ConfigError(source=str(e2e_dir), key="--data", value=str(e2e_dir), rule="e2e data directory not found")
    wanted = set(sources) if sources else None
    cache = SpecCache()
    rows: list[ValidationRow] = []
    if wanted is None or "aiconfigurator" in wanted:
        rows += read_aiconfigurator(e2e_dir / AIC_FILE, profiles, cache)
    if wanted is None or "llmservingsim" in wanted:
        rows += read_llmservingsim(e2e_dir / LSS_DIR, profiles["vllm"], cache)
    if wanted is None or "trtllm_throughput" in wanted:
        rows += read_trtllm_throughput(e2e_dir / THROUGHPUT_FILE, profiles, cache)
    if wanted is None or "trtllm_static" in wanted:
        rows += read_trtllm_static(e2e_dir / STATIC_FILE, profiles, cache)
    return [finalize(r, profiles, cache) for r in rows]
