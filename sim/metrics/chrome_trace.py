"""Chrome trace (Trace Event Format, for chrome://tracing or Perfetto) of a simulated run.

One process per replica (`pid` = replica). Thread 0 ("steps") holds one complete event (`"ph":
"X"`) per step record: a single step, or a run of identical back-to-back steps with the run's
length in `args.num_steps` (decode phases; see `sim.engine.records.StepRecord`). Its name is the
step kind (`prefill`, `decode`, `mixed`) and its args give the prefill chunks and tokens, decodes,
priced mean decode context, preemptions and each step's duration. Thread `1 + request_id` holds
one event per finished request, from its send to its last token as the client receives it (the
API server's latency after the engine's last step). Times are microseconds from the run start, as
the format requires. Never called from the simulation loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import IO, Any

from sim.engine.records import RequestRecord, StepRecord

_US_PER_S = 1e6


def trace_events(steps: Sequence[StepRecord], records: Sequence[RequestRecord]) -> Iterator[dict[str, Any]]:
    """Metadata, step and request events, in that order."""
    for replica in sorted({s.replica for s in steps} | {r.replica for r in records}):
        yield {"name": "process_name", "ph": "M", "pid": replica, "tid": 0, "args": {"name": f"replica {replica}"}}
        yield {"name": "thread_name", "ph": "M", "pid": replica, "tid": 0, "args": {"name": "steps"}}
    for s in steps:
        yield {
            "name": s.kind(), "cat": "step", "ph": "X", "pid": s.replica, "tid": 0,
            "ts": s.start_s * _US_PER_S, "dur": (s.end_s - s.start_s) * _US_PER_S,
            "args": {"kind": s.kind(), "num_steps": s.num_steps, "step_us": s.step_s * _US_PER_S,
                     "num_prefills": s.num_prefills, "num_prefill_tokens": s.num_prefill_tokens,
                     "num_decodes": s.num_decodes, "mean_decode_context_tokens": s.mean_decode_context_tokens,
                     "num_preempted": s.num_preempted},
        }
    for r in records:
        yield {
            "name": f"req {r.request_id}", "cat": "request", "ph": "X", "pid": r.replica, "tid": 1 + r.request_id,
            "ts": r.arrival_s * _US_PER_S, "dur": (r.finish_s - r.arrival_s) * _US_PER_S,
            "args": {"prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
                     "ttft_us": r.ttft_s() * _US_PER_S, "num_preemptions": r.num_preemptions},
        }


def write_chrome_trace(f: IO[str], steps: Sequence[StepRecord], records: Sequence[RequestRecord], *,
                       num_steps_not_logged: int = 0) -> None:
    """Write the trace as one JSON object, an event at a time (no list of all events in memory)."""
    f.write('{"displayTimeUnit": "ms", "otherData": ')
    f.write(json.dumps({"num_steps_not_logged": num_steps_not_logged}))
    f.write(', "traceEvents": [')
    for i, event in enumerate(trace_events(steps, records)):
        f.write(",\n" if i else "\n")
        f.write(json.dumps(event))
    f.write("\n]}\n")
