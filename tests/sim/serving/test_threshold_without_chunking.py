"""`long_prefill_token_threshold` as vLLM's scheduler applies it: with chunked prefill off it cuts a
waiting prompt before the budget check, so a prompt longer than the budget left beside the running
decodes starts as a threshold-sized chunk in the same step; and it caps a verification's 1 + drafts
tokens (`num_tokens_with_spec`) like any running request's."""

from __future__ import annotations

from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.speculative import AcceptanceSampler
from sim.serving.vllm_v1 import VllmV1Scheduler


def test_a_prompt_cut_to_the_threshold_is_admitted_in_the_budget_left() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=16, enable_chunked_prefill=False,
                            long_prefill_token_threshold=4, bulk_decodes=False, max_model_len=64)
    running = [RequestState(request_id=i, prompt_tokens=4, output_tokens=10, arrival_s=0.0, keys=())
               for i in range(3)]
    for r in running:
        sched.add(r)
    plan = sched.schedule()  # three 4-token prompts (the threshold does not cut them)
    assert plan is not None and [c.num_new_tokens for c in plan.chunks] == [4, 4, 4]
    sched.finish_step(plan)
    late = RequestState(request_id=9, prompt_tokens=14, output_tokens=2, arrival_s=0.0, keys=())
    sched.add(late)
    plan = sched.schedule()  # 3 decodes leave 13 tokens: the 14-token prompt cut to 4 fits them
    assert plan is not None
    chunks = {c.request.request_id: c.num_new_tokens for c in plan.chunks}
    assert chunks.get(9) == 4


def test_the_threshold_caps_a_verifications_drafts() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
                            long_prefill_token_threshold=3, bulk_decodes=False, num_speculative_tokens=4,
                            speculation=AcceptanceSampler((1.0,) * 4, seed=0), max_model_len=64)
    req = RequestState(request_id=0, prompt_tokens=3, output_tokens=20, arrival_s=0.0, keys=())
    sched.add(req)
    plan = sched.schedule()
    assert plan is not None and plan.chunks[0].num_new_tokens == 3
    sched.finish_step(plan)
    plan = sched.schedule()  # 1 + 4 drafts cut to the threshold: 1 + 2
    assert plan is not None
    (chunk,) = plan.chunks
    assert (chunk.num_new_tokens, chunk.num_draft_tokens) == (3, 2)
