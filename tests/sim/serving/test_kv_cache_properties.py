"""KV-cache invariants over random sequences of allocate / commit / free (hypothesis)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.kv_cache import KVCacheManager

NUM_BLOCKS = 8
BS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Seg:
    content_id: int
    num_tokens: int


@dataclass(slots=True)
class Req:
    """Test-side view of one request: prompt, output budget and tokens computed so far."""

    segments: tuple[Seg, ...]
    max_output_tokens: int
    computed_tokens: int = 0
    running: bool = False

    def num_prompt_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)

    def total_tokens(self) -> int:
        return self.num_prompt_tokens() + self.max_output_tokens


segments_st = st.lists(
    st.builds(Seg, content_id=st.integers(1, 3), num_tokens=st.integers(1, 10)),
    min_size=1,
    max_size=3,
).map(tuple)
request_st = st.builds(Req, segments=segments_st, max_output_tokens=st.integers(0, 6))
op_st = st.tuples(st.sampled_from(["step", "step", "free"]), st.integers(0, 5), st.integers(1, 12))


def check_invariants(
    kv: KVCacheManager, reqs: list[Req], content: dict[int, int], seen_keys: set[int]
) -> None:
    tables = [kv.blocks_of(i) for i in range(len(reqs))]
    occurrences = Counter(b for table in tables for b in table)
    free = kv.free_block_ids()
    assert len(set(free)) == len(free)
    for table in tables:
        assert len(set(table)) == len(table), "a block appears twice in one block table"
    for b in range(NUM_BLOCKS):
        assert kv.ref_count(b) >= 0
        assert kv.ref_count(b) == occurrences[b]
        assert (b in free) == (occurrences[b] == 0)
    assert kv.num_free_blocks() + len(occurrences) == NUM_BLOCKS
    for key in seen_keys:
        cached = kv.cached_block_id(key)
        assert cached is None or content.get(cached) == key, "the index points at stale tokens"


@settings(max_examples=200, deadline=None)
@given(
    reqs=st.lists(request_st, min_size=2, max_size=6),
    ops=st.lists(op_st, min_size=10, max_size=80),
    caching=st.booleans(),
)
def test_random_workloads_keep_block_accounting_consistent(
    reqs: list[Req], ops: list[tuple[str, int, int]], caching: bool
) -> None:
    kv = KVCacheManager(num_blocks=NUM_BLOCKS, block_size=BS, enable_prefix_caching=caching)
    content: dict[int, int] = {}  # block -> key of the tokens the test last wrote into it
    seen_keys: set[int] = set()
    for kind, idx, chunk in ops:
        rid = idx % len(reqs)
        req = reqs[rid]
        if kind == "free":
            kv.free(rid)
            req.running = False
            req.computed_tokens = 0
        elif req.computed_tokens < req.total_tokens():
            n_prompt = req.num_prompt_tokens()
            start = req.computed_tokens
            hit = 0
            keys = kv.prompt_block_keys(req.segments, rid, n_prompt)
            seen_keys.update(keys)
            if not req.running:
                hit = kv.get_computed_tokens(keys, n_prompt)
                assert hit % BS == 0 and 0 <= hit < n_prompt
                start = hit
            end = min(start + chunk, req.total_tokens())
            before = (kv.free_block_ids(), [kv.blocks_of(i) for i in range(len(reqs))])
            before_refs = [kv.ref_count(b) for b in range(NUM_BLOCKS)]
            ok = kv.allocate(rid, num_tokens=end, keys=keys, num_computed_tokens=hit)
            if not ok:
                after = (kv.free_block_ids(), [kv.blocks_of(i) for i in range(len(reqs))])
                assert after == before
                assert [kv.ref_count(b) for b in range(NUM_BLOCKS)] == before_refs
            else:
                table = kv.blocks_of(rid)
                num_kept = len(before[1][rid]) if req.running else hit // BS
                if not req.running:
                    for i in range(num_kept):
                        assert content.get(table[i]) == keys[i], "a hit block holds other tokens"
                for b in table[num_kept:]:
                    content.pop(b, None)  # newly allocated: its old tokens are overwritten
                req.running = True
                req.computed_tokens = end
                kv.commit(rid, end, keys)
                for i in range(min(end // BS, len(keys))):
                    assert content.setdefault(table[i], keys[i]) == keys[i]
        check_invariants(kv, reqs, content, seen_keys)

    for rid in range(len(reqs)):
        kv.free(rid)
    check_invariants(kv, reqs, content, seen_keys)
    assert kv.num_free_blocks() == NUM_BLOCKS
    assert kv.usage_frac() == 0.0
    assert all(kv.ref_count(b) == 0 for b in range(NUM_BLOCKS))
