"""The launch lines of a trial's configuration: `vllm serve` and SGLang, one per pool when disaggregated,
and NVIDIA Dynamo's when disaggregated.

Keys (in `--json` `best`, `best_configs.json`): `vllm_serve` and `sglang_launch` (for a
disaggregated trial: both pools' lines, each under a `# prefill pool: ...` comment), and for a
disaggregated trial also `vllm_serve_prefill`, `vllm_serve_decode`, `sglang_launch_prefill`,
`sglang_launch_decode` (one line each), and Dynamo's: `dynamo_vllm` and `dynamo_sglang` (the
frontend and both pools' worker lines), `dynamo_vllm_prefill`, `dynamo_vllm_decode`,
`dynamo_sglang_prefill`, `dynamo_sglang_decode` (one worker line each); an engine over more GPUs
than a node holds has one line per node under comments in each key (`multinode`); `checkpoint_note` when the
lines need another checkpoint than `[model] name` (an NVFP4 / MXFP4 engine on a checkpoint not in that
format: `vllm_command.checkpoint_note`).
"""

from __future__ import annotations

from orchestrator.sweep.dynamo_command import dynamo_launch, dynamo_pool_commands
from orchestrator.sweep.sglang_command import sglang_launch_command, sglang_pool_commands
from orchestrator.sweep.vllm_command import checkpoint_note, pool_comment, vllm_pool_commands, vllm_serve_command
from sim.specs.scenario import Scenario


def launch_commands(scenario: Scenario) -> dict[str, str]:
    note = checkpoint_note(scenario)
    extra = {"checkpoint_note": note} if note else {}
    if scenario.disaggregation is None:
        return {"vllm_serve": vllm_serve_command(scenario), "sglang_launch": sglang_launch_command(scenario),
                **extra}
    out: dict[str, str] = dict(extra)
    for engine, lines in (("vllm_serve", vllm_pool_commands(scenario)),
                          ("sglang_launch", sglang_pool_commands(scenario))):
        out[engine] = "\n".join(f"{pool_comment(scenario, pool)}\n{line}" for pool, line in lines.items())
        out.update({f"{engine}_{pool}": line for pool, line in lines.items()})
    for engine, lines in dynamo_pool_commands(scenario).items():
        out[f"dynamo_{engine}"] = dynamo_launch(scenario, engine)
        out.update({f"dynamo_{engine}_{pool}": line for pool, line in lines.items()})
    return out
