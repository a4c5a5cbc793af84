"""Pipeline micro-batches: a pipeline-parallel replica keeps one micro-batch per stage in flight.

vLLM (its batch queue of `pipeline_parallel_size` scheduled batches), SGLang and TensorRT-LLM
(micro-batching over the stages) keep the stages busy with p = `pipeline_parallel_size` batches at
once: while stage 2 runs micro-batch 1, stage 1 runs micro-batch 2. The simulator models the
pipeline's steady state with one scheduler per replica and one step per pipeline cycle:

- the step holds all p micro-batches: p times the token budget (each micro-batch has its own
  `max_num_batched_tokens`; a prompt chunk gets at most what one budget leaves beside that
  micro-batch's share of the running requests: `VllmV1Scheduler`), and the running
  requests of all of them (vLLM bounds them together by `max_num_seqs`; TensorRT-LLM's
  `max_batch_size` bounds each micro-batch: `SchedulingPolicy.max_num_seqs_per_micro_batch`;
  SGLang's `pp_max_micro_batch_size`, max(`max_num_seqs` // p, 1), each micro-batch:
  `SchedulingPolicy.max_num_seqs_split_over_micro_batches`);
- the step is split into p micro-batches (`split_step`): the decodes spread evenly, the prompt
  chunks placed largest first on the micro-batch with the fewest tokens;
- it lasts the longest of (`StepPricer._pipeline_step_s`): its slowest micro-batch's step through
  the whole pipeline (every stage's kernels and the stage-to-stage sends, as a one-batch step: each
  micro-batch crosses every stage once per cycle); the busiest stage's GPU work on every
  micro-batch (each stage runs each micro-batch once per cycle: its share of the layers, by the
  engine's split `stage_layer_ranges`, the embedding on the first stage, the final norm, LM head
  and sampler on the last, the hop into it); and the busiest stage's host thread (the scheduling
  work of every micro-batch, and its share of their kernel launches: each rank launches its own
  stage's kernels).

One scheduler keeps the KV cache, preemption and admission exactly as one engine has them; what
the model leaves out is that the real micro-batches are offset in time (a request arriving
mid-cycle waits for the next cycle here, for the next micro-batch there: TTFT slightly high) and
that their shares of the decodes drift from even. Replicas that step in lockstep (an MoE model's
attention data-parallel ranks) keep one batch at a time.
"""

from __future__ import annotations

from sim.specs.scenario import Scenario, ranks_in_lockstep

ChunkShape = tuple[int, int, int]
"""A prompt chunk in a step key: (new tokens, context tokens, samples)."""


def pipeline_micro_batches(scenario: Scenario) -> int:
    """Micro-batches a replica of `scenario` keeps in flight: `pipeline_parallel_size`, or 1 where
    its ranks step in lockstep (an MoE model with data parallelism: `sim.serving.dp_group`)."""
    engine = scenario.engine
    if engine.pipeline_parallel_size == 1:
        return 1
    if ranks_in_lockstep(scenario.model, engine):
        return 1
    return engine.pipeline_parallel_size


def split_step(prefills: tuple[ChunkShape, ...], num_decode: int, micro_batches: int
               ) -> list[tuple[tuple[ChunkShape, ...], int]]:
    """A step's micro-batches: (sorted prompt chunks, decodes) each, empty ones left out.

    The decodes spread evenly (the first `num_decode % micro_batches` micro-batches take one more),
    as a pipeline's steady state keeps them; each prompt chunk, largest first, goes to the
    micro-batch with the fewest tokens so far (the first of equals)."""
    base, extra = divmod(num_decode, micro_batches)
    decodes = [base + (i < extra) for i in range(micro_batches)]
    tokens = list(decodes)
    chunks: list[list[ChunkShape]] = [[] for _ in range(micro_batches)]
    for chunk in sorted(prefills, key=lambda c: (-c[0], c[1], c[2])):
        i = tokens.index(min(tokens))
        chunks[i].append(chunk)
        tokens[i] += chunk[0]
    return [(tuple(sorted(c)), d) for c, d in zip(chunks, decodes, strict=True) if c or d]
