"""Host (CPU) overhead of one serving step, by launch mode, as a pure function of the step.

Per step the engine pays scheduling, input preparation, sampling and output processing, each
linear in the number of sequences (`a + b x n`), fitted on measured per-step CPU times (see
`HostOverheadParams.source`). Launch modes:
- `eager`: every kernel launch costs `eager_launch_s` of CPU time; the GPU idles when launches are
  slower than the kernels, so each kernel takes at least that long;
- `cuda_graph`: decode-only steps within `max_cudagraph_capture_size` replay a graph (`graph_launch_s`
  per step), the size bounding the step's tokens or its requests as the engine counts them
  (`graph_capture_unit`); the other steps launch as the engine does (`uncaptured_launch`):
  piecewise graphs around attention (vLLM; one launch per layer per piece) or kernel by kernel, as
  in `eager` (SGLang and TensorRT-LLM capture decode batches only);
- `megakernel`: one persistent kernel, no launch gaps (a what-if for persistent-kernel compilers).
With async scheduling the CPU work of step n+1 overlaps the GPU work of step n, so a step costs
max(GPU, CPU) instead of GPU + CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sim.serde import require

LaunchMode = Literal["eager", "cuda_graph", "megakernel"]
UncapturedLaunch = Literal["piecewise_graph", "eager"]
GraphCaptureUnit = Literal["tokens", "requests"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearCost:
    base_s: float
    per_item_s: float

    def __post_init__(self) -> None:
        require(self.base_s >= 0, "base_s", self.base_s, "must be >= 0")
        require(self.per_item_s >= 0, "per_item_s", self.per_item_s, "must be >= 0")

    def at(self, n: int) -> float:
        return self.base_s + self.per_item_s * n


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOverheadParams:
    schedule: LinearCost
    prepare_inputs: LinearCost
    sampler: LinearCost
    process_outputs: LinearCost
    graph_launch_s: float
    """CPU cost of replaying one captured CUDA graph."""
    eager_launch_s: float
    """CPU cost of one eager kernel launch."""
    source: str
    """Data and method the numbers come from."""
    api_server_latency_s: float = 0.0
    """Time a request spends outside the engine as a client of the engine's OpenAI-compatible server
    sees it (HTTP, chat template and tokenization before the engine queues it; detokenization and
    streaming of the first and the last token back): added to each request's first-token and finish
    times, so to TTFT and E2E, not to TPOT or ITL. Fitted on dev rows measured through the server
    (`api_server_latency_fit`); a scenario overrides it with `[engine] api_server_latency_s`."""
    api_server_latency_fit: str = ""
    """What `api_server_latency_s` was fitted on, and how."""
    uncaptured_launch: UncapturedLaunch = "piecewise_graph"
    """How a `cuda_graph` engine launches a step its full graphs do not capture (one with a prompt
    chunk, or more decodes than the largest capture): `piecewise_graph` (vLLM V1: captured pieces
    between eager attention calls) or `eager` (SGLang, TensorRT-LLM's PyTorch flow: CUDA graphs for
    decode batches only; each kernel costs `eager_launch_s`)."""
    graph_capture_unit: GraphCaptureUnit = "tokens"
    """What `max_cudagraph_capture_size` bounds in a decode-only step: `tokens` (vLLM v1: its dispatcher
    pads the step's scheduled tokens, 1 + k per decode verifying k drafts, to a capture size) or
    `requests` (SGLang's `cuda_graph_max_bs`, `CudaGraphRunner.can_run` comparing the batch size, and
    TensorRT-LLM's `cuda_graph_config.max_batch_size`, graphs keyed by (batch size, draft length)):
    a verification's 1 + k tokens per request are inside the graph of its batch size."""

    def __post_init__(self) -> None:
        for key in ("graph_launch_s", "eager_launch_s", "api_server_latency_s"):
            value = getattr(self, key)
            require(value >= 0, key, value, "must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCost:
    cpu_s: float
    """Scheduling, input preparation, sampling and output processing."""
    launch_s: float
    """CPU time spent launching kernels or graphs."""
    launch_floor_s: float
    """Extra GPU idle time when eager launches are slower than kernels."""
    serial_launch_s: float | None = None
    """Launch time the GPU waits for before its first kernel in a synchronous step: one eager launch
    (the others overlap the kernels, their excess over a short kernel being `launch_floor_s`), or the
    whole graph launch; None: all of `launch_s`."""


def _captured(params: HostOverheadParams, is_decode_only: bool, num_seqs: int, num_tokens: int,
              max_cudagraph_capture_size: int) -> bool:
    """A decode-only batch within the largest capture replays one full CUDA graph. The capture size
    bounds what the engine keys its graphs by (`graph_capture_unit`): scheduled tokens (vLLM v1's
    dispatcher pads the batch's tokens to a capture size; a decode verifying k drafts is 1 + k of
    them) or requests (SGLang, TensorRT-LLM)."""
    size = num_seqs if params.graph_capture_unit == "requests" else num_tokens
    return is_decode_only and size <= max_cudagraph_capture_size


def launches_eagerly(*, params: HostOverheadParams, mode: LaunchMode, is_decode_only: bool, num_seqs: int,
                     max_cudagraph_capture_size: int, num_tokens: int | None = None) -> bool:
    """Whether a step launches its kernels one by one (each `eager_launch_s` of CPU time); `num_tokens`
    (default `num_seqs`: one token each) the scheduled tokens, which the capture sizes bound where the
    engine keys its graphs by tokens (`graph_capture_unit`)."""
    if mode != "cuda_graph":
        return mode == "eager"
    tokens = num_seqs if num_tokens is None else num_tokens
    return (not _captured(params, is_decode_only, num_seqs, tokens, max_cudagraph_capture_size)
            and params.uncaptured_launch == "eager")


def host_cost(
    *,
    params: HostOverheadParams,
    mode: LaunchMode,
    num_seqs: int,
    num_sampled: int,
    is_decode_only: bool,
    max_cudagraph_capture_size: int,
    num_launches: int,
    num_layers: int,
    short_kernel_gap_s: float,
    num_tokens: int | None = None,
) -> HostCost:
    """CPU cost of a step. `short_kernel_gap_s` = sum over launches of max(0, launch - kernel);
    `num_tokens` (default `num_seqs`) the scheduled tokens (`launches_eagerly`)."""
    cpu = (params.schedule.at(num_seqs) + params.prepare_inputs.at(num_seqs)
           + params.sampler.at(num_sampled) + params.process_outputs.at(num_seqs))
    tokens = num_seqs if num_tokens is None else num_tokens
    if launches_eagerly(params=params, mode=mode, is_decode_only=is_decode_only, num_seqs=num_seqs,
                        max_cudagraph_capture_size=max_cudagraph_capture_size, num_tokens=tokens):
        return HostCost(cpu_s=cpu, launch_s=num_launches * params.eager_launch_s, launch_floor_s=short_kernel_gap_s,
                        serial_launch_s=params.eager_launch_s if num_launches else 0.0)
    if mode == "cuda_graph" and not _captured(params, is_decode_only, num_seqs, tokens, max_cudagraph_capture_size):
        # Piecewise graphs: attention runs eagerly between captured pieces, two pieces per layer.
        return HostCost(cpu_s=cpu, launch_s=2 * num_layers * params.graph_launch_s, launch_floor_s=0.0)
    return HostCost(cpu_s=cpu, launch_s=params.graph_launch_s, launch_floor_s=0.0)


def step_time_s(*, device_s: float, host: HostCost, async_scheduling: bool) -> float:
    """Wall time of a step given GPU (kernels + collectives) and host costs. Asynchronous
    scheduling overlaps the CPU's work with the GPU's; a synchronous step runs them in turn, the
    kernel launches overlapping the kernels they launch (eagerly launched kernels wait for the first
    launch, and for the ones slower than their kernels through `launch_floor_s`)."""
    gpu = device_s + host.launch_floor_s
    cpu = host.cpu_s + host.launch_s
    if async_scheduling:
        return max(gpu, cpu)
    serial = host.launch_s if host.serial_launch_s is None else host.serial_launch_s
    return host.cpu_s + serial + max(gpu, host.launch_s - serial)
