"""The measuring environment: torch and kernel libraries (imported lazily), the device check that
refuses to "measure" without a GPU, the GPU's identity and clocks for `device.json`, and the
catalog hardware it matches (for the plan's time budget and the tables' sanity flags).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import re
import subprocess
import sys
from typing import Any, Final

from sim.errors import ConfigError
from sim.specs.catalog import list_hardware, load_hardware
from sim.specs.hardware import HardwareSpec

OPTIONAL_LIBRARIES: Final = ("flashinfer", "flash_attn", "flash_attn_interface")
DISTRIBUTIONS: Final = (
    "torch", "triton", "flashinfer-python", "flash-attn", "flash_attn_3", "vllm", "sglang", "numpy",
    "nvidia-nccl-cu12", "nvidia-cublas-cu12", "nvidia-cudnn-cu12", "nvidia-cuda-runtime-cu12")
NVIDIA_SMI_FIELDS: Final = (
    "name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.limit",
    "persistence_mode", "temperature.gpu", "pstate")
INSTALL_HINT: Final = "pip install 'kernelsight[microbench]' (PyTorch with CUDA)"


def import_torch() -> Any:
    """The torch module, or None where it is not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def optional_libraries() -> dict[str, Any]:
    """Attention/norm kernel libraries that import cleanly here."""
    found: dict[str, Any] = {}
    for name in OPTIONAL_LIBRARIES:
        try:
            found[name] = importlib.import_module(name)
        except Exception:  # absent, or built for another CUDA/torch: not usable either way
            continue
    return found


def check_device(device: str, *, dry_run: bool, torch: Any) -> str:
    """The device to measure on; `ConfigError` (exit 2) where nothing meaningful can be measured."""
    where = "microbench run"
    if device == "cpu":
        if not dry_run:
            raise ConfigError(source=where, key="--device", value=device,
                              rule="CPU timings say nothing about GPU kernels; --device cpu needs --dry-run")
        return device
    if not re.fullmatch(r"cuda(:\d+)?", device):  # checked before torch: `cuda:x`, `cuda0` are typos
        raise ConfigError(source=where, key="--device", value=device, rule="must be cuda[:N] or cpu (with --dry-run)")
    if torch is None:
        raise ConfigError(source=where, key="--device", value=device,
                          rule=f"needs PyTorch, which is not installed: {INSTALL_HINT}; "
                               "`--dry-run --device cpu` exercises the path without it")
    if not torch.cuda.is_available():
        raise ConfigError(source=where, key="--device", value=device,
                          rule=f"no CUDA GPU is visible (torch {torch.__version__}, built for CUDA "
                               f"{torch.version.cuda or 'none'}): microbench run measures GPU kernels and needs "
                               "one; `--dry-run --device cpu` exercises plan -> timing loop -> files without it")
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    count = int(torch.cuda.device_count())
    if not 0 <= index < count:
        raise ConfigError(source=where, key="--device", value=device, rule=f"{count} CUDA device(s) visible")
    return f"cuda:{index}"


def identify_hardware(torch: Any, device: str) -> HardwareSpec | None:
    """The catalog GPU with this compute capability and SM count whose memory is closest (within 15%)."""
    props = torch.cuda.get_device_properties(device)
    sm = props.major * 10 + props.minor
    best: tuple[float, HardwareSpec] | None = None
    for name in list_hardware():
        hw = load_hardware(name)
        if hw.sm_version != sm or hw.num_sms != props.multi_processor_count:
            continue
        gap = abs(hw.hbm_capacity_bytes - props.total_memory) / hw.hbm_capacity_bytes
        if gap <= 0.15 and (best is None or gap < best[0]):
            best = (gap, hw)
    return best[1] if best else None


def l2_cache_bytes(torch: Any, device: str, hw: HardwareSpec | None) -> int:
    if device.startswith("cuda"):
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        if l2 > 0:
            return l2
    return hw.l2_cache_bytes if hw is not None else 1 << 20


def free_memory_bytes(torch: Any, device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return 1 << 30


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries whose kernels a run may time (from package metadata)."""
    out: dict[str, str] = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _smi_rows(select: list[str]) -> list[list[str]]:
    cmd = ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader,nounits", *select]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[v.strip() for v in line.split(",")] for line in done.stdout.strip().splitlines()]
    return [r for r in rows if len(r) == len(NVIDIA_SMI_FIELDS)]


def nvidia_smi(uuid: str | None) -> dict[str, str]:
    """Clocks, power limit and state of the GPU as nvidia-smi reports them now ({} if unavailable).

    Selected by UUID; where that fails, the first GPU nvidia-smi lists, marked `matched_by: first`.
    """
    if uuid:
        rows = _smi_rows(["-i", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"])
        if rows:
            return {**dict(zip(NVIDIA_SMI_FIELDS, rows[0], strict=True)), "matched_by": "uuid"}
    rows = _smi_rows([])
    return {**dict(zip(NVIDIA_SMI_FIELDS, rows[0], strict=True)), "matched_by": "first"} if rows else {}


def device_info(torch: Any, device: str) -> dict[str, Any]:
    """What `device.json` records about the device and the software stack."""
    info: dict[str, Any] = {"device": device, "python": sys.version.split()[0], "platform": platform.platform(),
                            "libraries": library_versions()}
    if torch is None:
        info.update(torch=None, gpu=None)
        return info
    info["torch"] = str(torch.__version__)
    if not device.startswith("cuda"):
        info.update(gpu=None, cpu=platform.processor() or platform.machine())
        return info
    from orchestrator.microbench.collectives import nccl_version

    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "") or None
    smi = nvidia_smi(uuid)
    info.update(
        gpu={"name": props.name, "uuid": uuid, "compute_capability": f"{props.major}.{props.minor}",
             "num_sms": props.multi_processor_count, "memory_bytes": props.total_memory,
             "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0) or 0)},
        driver_version=smi.get("driver_version"), cuda_runtime=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(), nccl=nccl_version(torch), visible_gpus=torch.cuda.device_count(),
        nvidia_smi_before=smi)
    return info
