"""Speculative decoding after a recompute preemption: vLLM clears a preempted request's drafts
(`Scheduler._preempt_request`: `spec_token_ids = []`), and the drafter proposes new ones only
after a step that samples, so a resumed request's last recompute chunk verifies no drafts."""

from __future__ import annotations

from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.scheduler import StepPlan
from sim.serving.speculative import AcceptanceSampler
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.workload.requests import UNIQUE_CONTENT_BASE, Segment, prefix_content_id


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


def _preempting_pair(*, drop_last_hit_block: bool) -> tuple[VllmV1Scheduler, RequestState, list[StepPlan]]:
    """Two 9-token prompts (block size 4, 7 blocks) whose verifications accept both drafts: step 2
    verifies 1 + 2 tokens each (10 known, 12 computed after it), and in step 3 b's fourth block
    does not fit beside a's, so b preempts itself; a finishes in step 3 and b resumes in step 4."""
    kv = KVCacheManager(num_blocks=7, block_size=4, enable_prefix_caching=True)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0, bulk_decodes=False, num_speculative_tokens=2,
                            speculation=AcceptanceSampler((1.0, 1.0), seed=0), max_model_len=64,
                            drop_last_hit_block=drop_last_hit_block)
    a, b = (RequestState(request_id=i, prompt_tokens=9, output_tokens=n, arrival_s=0.0, keys=(),
                         segments=(Segment(content_id=UNIQUE_CONTENT_BASE + i, num_tokens=9),))
            for i, n in ((0, 5), (1, 20)))
    sched.add(a)
    sched.add(b)
    plans = []
    for _ in range(4):
        plan = sched.schedule()
        assert plan is not None
        plans.append(plan)
        sched.finish_step(plan)
    assert [c.num_draft_tokens for c in plans[1].chunks] == [2, 2]
    assert [r.request_id for r in plans[2].preempted] == [1] and a.is_finished()
    return sched, b, plans


def test_a_resumed_request_does_not_hit_the_block_its_accepted_drafts_filled() -> None:
    """vLLM's `allocate_slots` indexes a step's blocks up to the tokens known when it schedules it
    (`min(computed + new, request.num_tokens)`: drafts are not known). b's step 2 ran with 10 known
    tokens, so blocks 0-1 are indexed; block 2 (tokens 8-11) was filled by its two accepted drafts
    and would be indexed by its next step's allocation, which never came. On resume b hits 8 tokens
    and recomputes 5 of its 13 (before the fix the preemption indexed block 2 too: a 12-token hit
    and one token recomputed)."""
    _, b, plans = _preempting_pair(drop_last_hit_block=False)
    (chunk,) = plans[3].chunks
    assert (chunk.request, chunk.num_context_tokens, chunk.num_new_tokens) == (b, 8, 5)
    assert plans[3].num_prefix_hit_tokens == 8
    assert b.recomputed_tokens == 12 - 8


def test_with_an_eagle_drafter_a_hit_gives_back_its_last_block() -> None:
    """vLLM with a drafter on the target's hidden states (`use_eagle()`) pops the last block of a
    prefix-cache hit (`FullAttentionManager.find_longest_cache_hit`): the resumed b above hits 4
    tokens, not 8, and a new request sharing a 2-block prefix hits 1 block of it."""
    _, b, plans = _preempting_pair(drop_last_hit_block=True)
    (chunk,) = plans[3].chunks
    assert (chunk.num_context_tokens, chunk.num_new_tokens, plans[3].num_prefix_hit_tokens) == (4, 9, 4)
    assert b.recomputed_tokens == 12 - 4

    for drop, hit in ((False, 8), (True, 4)):
        kv = KVCacheManager(num_blocks=32, block_size=4, enable_prefix_caching=True)
        sched = VllmV1Scheduler(kv=kv, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
                                long_prefill_token_threshold=0, bulk_decodes=False, num_speculative_tokens=2,
                                speculation=AcceptanceSampler((1.0, 1.0), seed=0), drop_last_hit_block=drop)
        shared = Segment(content_id=prefix_content_id(0), num_tokens=8)
        first, second = (RequestState(request_id=i, prompt_tokens=11, output_tokens=4, arrival_s=0.0,
                                      keys=kv.prompt_block_keys((shared,), i, 8), segments=(
                                          shared, Segment(content_id=UNIQUE_CONTENT_BASE + i, num_tokens=3)))
                         for i in range(2))
        sched.add(first)
        plan = sched.schedule()
        assert plan is not None and plan.num_prefix_hit_tokens == 0
        sched.finish_step(plan)
        sched.add(second)
        plan = sched.schedule()
        assert plan is not None and plan.num_prefix_hit_tokens == hit
        assert second.prefix_hit_tokens == hit and plan.chunks[-1].num_new_tokens == 11 - hit
