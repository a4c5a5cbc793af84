"""What every kernel benchmark shares: the device context, the prepared callable, rotation sizing.

A builder turns a shape into a `Prepared`: a callable `run(i)` that launches the kernel once on
rotation copy `i % copies`, plus the labels that go into the output tables. Builders raise
`Unsupported` when the device or the installed libraries cannot run the shape; the runner then
tries the next candidate implementation. torch and the attention libraries are handles passed in
the context (typed `Any`), so nothing here imports them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.microbench.timing import TimingParams

MAX_COPIES: Final = 256


class Unsupported(Exception):
    """This implementation cannot run this shape here (the reason names what is missing)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    run: Callable[[int], None]
    copies: int
    """Rotation copies `run` cycles through (1 = no rotation)."""
    backend: str
    backend_version: str
    kernel_source: str
    variant: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchContext:
    """Device and libraries a run measures with."""

    torch: Any
    """The torch module, or None (dry run without torch: kernels are Python no-ops)."""
    device: str
    """`cuda:N` or `cpu`."""
    dry_run: bool
    timing: TimingParams
    rotate_bytes: int
    """Bytes a rotation set must span so that a copy leaves L2 before it is read again (3 x L2)."""
    max_rotation_bytes: int
    """Cap on the memory one point's rotation copies may take."""
    compute_capability: tuple[int, int] | None = None
    libraries: Mapping[str, Any] = field(default_factory=dict)
    """Optional kernel libraries found at start: `flashinfer`, `flash_attn`, `flash_attn_interface`."""
    attention_backend: str = "auto"

    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def torch_version(self) -> str:
        return str(self.torch.__version__) if self.torch is not None else "none"

    def require_torch(self) -> Any:
        if self.torch is None:
            raise Unsupported("torch is not installed")
        return self.torch

    def sync(self) -> None:
        if self.torch is not None and self.is_cuda():
            self.torch.cuda.synchronize()


def one_line(exc: BaseException, limit: int = 200) -> str:
    """`Type: message` on one line, truncated (reasons go into CSV cells)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"


def probe(prepared: Prepared, ctx: BenchContext, what: str) -> Prepared:
    """Run one call; a library refusing the configuration (or running out of memory) is `Unsupported`.

    Used where support depends on the library build or the GPU (FP8 scaled GEMMs, FlashInfer JIT,
    FlashAttention head sizes), so that it reads as "cannot run here", not as a crash.
    """
    try:
        prepared.run(0)
        ctx.sync()
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        raise Unsupported(f"{what} refused: {one_line(exc)}") from None
    return prepared


def copies_for(bytes_per_copy: float, ctx: BenchContext) -> int:
    """Rotation copies so that `copies x bytes_per_copy >= rotate_bytes`, within the memory cap."""
    if bytes_per_copy <= 0:
        return 1
    wanted = math.ceil(ctx.rotate_bytes / bytes_per_copy)
    affordable = max(int(ctx.max_rotation_bytes // bytes_per_copy), 1)
    return max(1, min(wanted, affordable, MAX_COPIES))


def torch_dtype(torch: Any, name: str) -> Any:
    """torch dtype for a table dtype name (`fp8` = e4m3, the format serving engines store)."""
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
             "fp16": torch.float16, "float32": torch.float32}
    if name in table:
        return table[name]
    if name in ("fp8", "fp8_block"):
        return torch.float8_e4m3fn
    raise Unsupported(f"dtype {name!r} has no torch equivalent here")


def random_tensor(torch: Any, shape: tuple[int, ...], dtype: Any, device: str) -> Any:
    """Random values in [-1, 1) stored as `dtype` (FP8 via a bf16 draw: torch cannot draw FP8 directly)."""
    draw_dtype = torch.bfloat16 if dtype in (torch.float8_e4m3fn,) else dtype
    t = torch.empty(shape, dtype=draw_dtype, device=device).uniform_(-1.0, 1.0)
    return t if draw_dtype is dtype else t.to(dtype)


def noop(label: str) -> Prepared:
    """The dry-run stand-in when torch is absent: the loop, files and labels run; the kernel does not."""

    def run(i: int) -> None:
        return None

    return Prepared(run=run, copies=1, backend="none", backend_version="none", kernel_source=f"dry_run_{label}")
