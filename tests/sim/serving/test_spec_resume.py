"""Speculative decoding after a recompute preemption: vLLM clears a preempted request's drafts
(`Scheduler._preempt_request`: `spec_token_ids = []`), and the drafter proposes new ones only
after a step that samples, so a resumed request's last recompute chunk verifies no drafts."""

from __future__ import annotations

from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.speculative import AcceptanceSampler
from sim.serving.vllm_v1 import VllmV1Scheduler


def test_a_resumed_requests_last_recompute_token_carries_no_drafts() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
                            long_prefill_token_threshold=11, bulk_decodes=False, num_speculative_tokens=2,
                            speculation=AcceptanceSampler((1.0, 1.0), seed=0), max_model_len=64)
    a = RequestState(request_id=0, prompt_tokens=8, output_tokens=5, arrival_s=0.0, keys=())
    b = RequestState(request_id=1, prompt_tokens=8, output_tokens=20, arrival_s=0.0, keys=())
    sched.add(a)
    sched.add(b)
    plans = []
    for _ in range(5):
        plan = sched.schedule()
        assert plan is not None
        plans.append(plan)
        sched.finish_step(plan)
    assert [r.request_id for r in plans[2].preempted] == [1]  # step 3: a's verification preempts b
    assert a.is_finished()
    (chunk,) = plans[3].chunks  # step 4: b recomputes 11 of its 12 known tokens (the threshold)
    assert (chunk.request, chunk.num_new_tokens, chunk.num_context_tokens, chunk.samples) == (b, 11, 0, False)
    (chunk,) = plans[4].chunks  # step 5: its last known token, with no drafts to verify
    assert (chunk.num_new_tokens, chunk.num_context_tokens, chunk.num_draft_tokens) == (1, 11, 0)
    assert chunk.samples and b.num_output == 5
    plan = sched.schedule()  # step 6: it sampled, so the drafter proposed: 1 + 2 tokens
    assert plan is not None and plan.chunks[0].num_draft_tokens == 2
