"""Paged KV cache with prefix caching: tiny hand-computed scenarios (block size 4, eight blocks)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

import pytest

from sim.serving.kv_cache import ROOT_KEY, KVCacheManager, segment_block_keys

BS = 4
REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True, slots=True, kw_only=True)
class Seg:
    content_id: int
    num_tokens: int


def seg(content_id: int, num_tokens: int) -> Seg:
    return Seg(content_id=content_id, num_tokens=num_tokens)


def make_cache(*, caching: bool = True, num_blocks: int = 8) -> KVCacheManager:
    return KVCacheManager(num_blocks=num_blocks, block_size=BS, enable_prefix_caching=caching)


def run_prefill(
    kv: KVCacheManager, rid: int, segments: tuple[Seg, ...], *, record: bool = False
) -> tuple[tuple[int, ...], int]:
    """Look up, allocate and commit the whole prompt, as a scheduler does in one prefill step."""
    n = sum(s.num_tokens for s in segments)
    keys = kv.prompt_block_keys(segments, rid, n)
    hit = kv.get_computed_tokens(keys, n)
    if record:
        kv.record_prefix_query(n, hit)
    assert kv.allocate(rid, num_tokens=n, keys=keys, num_computed_tokens=hit)
    kv.commit(rid, n, keys)
    return keys, hit


def _spanning_key(parent: int, *pieces: int) -> int:
    """Key of a block made of several pieces: first 8 bytes of blake2b over the int64s."""
    data = struct.pack(f"<Q{len(pieces)}q", parent, *pieces)
    return int.from_bytes(blake2b(data).digest()[:8], "little")


def _run_keys(parent: int, tag: int, ident: int, offset: int, chunk: int) -> tuple[int, ...]:
    """Keys of eight consecutive whole blocks of one segment: one 64-byte digest."""
    data = struct.pack("<Q4qQ", parent, tag, ident, offset, BS, chunk)
    return struct.unpack("<8Q", blake2b(data).digest())


# Keys


def test_keys_chain_blake2b_over_runs_and_spanning_blocks() -> None:
    keys = segment_block_keys([seg(1, 6), seg(2, 7)], block_size=BS, num_tokens=13, request_id=9)
    k0 = _run_keys(ROOT_KEY, 0, 1, 0, 0)[0]
    k1 = _spanning_key(k0, 0, 1, 4, 2, 0, 2, 0, 2)  # two tokens of content 1, then two of content 2
    k2 = _run_keys(k1, 0, 2, 2, 0)[0]
    assert keys == (k0, k1, k2)  # the 13th token is a partial block: no key


def test_a_long_run_takes_eight_keys_per_digest_and_chains_from_its_parent() -> None:
    keys = segment_block_keys([seg(3, 2), seg(4, 46)], block_size=BS, num_tokens=48, request_id=0)
    k0 = _spanning_key(ROOT_KEY, 0, 3, 0, 2, 0, 4, 0, 2)
    assert keys == (k0, *_run_keys(k0, 0, 4, 2, 0), *_run_keys(k0, 0, 4, 2, 1)[:3])


def test_a_prefix_has_the_same_keys_whatever_follows_it() -> None:
    long = segment_block_keys([seg(1, 40), seg(2, 9)], block_size=BS, num_tokens=49, request_id=0)
    for n in range(0, 49):
        segs = [seg(1, 40), seg(2, 9)]
        short = segment_block_keys(segs, block_size=BS, num_tokens=n, request_id=0)
        assert short == long[: n // BS]
    other = segment_block_keys([seg(1, 37), seg(5, 3)], block_size=BS, num_tokens=40, request_id=0)
    assert other[:9] == long[:9] and other[9] != long[9]


def test_keys_depend_on_the_whole_prefix() -> None:
    a = segment_block_keys([seg(1, 6), seg(2, 6)], block_size=BS, num_tokens=12, request_id=0)
    b = segment_block_keys([seg(1, 6), seg(3, 6)], block_size=BS, num_tokens=12, request_id=0)
    c = segment_block_keys([seg(1, 4), seg(1, 8)], block_size=BS, num_tokens=12, request_id=0)
    assert a[0] == b[0] == c[0]
    assert a[1] != b[1] and a[2] != b[2]
    assert c[1] != segment_block_keys([seg(1, 12)], block_size=BS, num_tokens=12, request_id=0)[1]


def test_tokens_past_the_segments_are_private_output_blocks() -> None:
    segs = [seg(1, 8)]
    prompt = segment_block_keys(segs, block_size=BS, num_tokens=8, request_id=5)
    longer5 = segment_block_keys(segs, block_size=BS, num_tokens=12, request_id=5)
    longer6 = segment_block_keys(segs, block_size=BS, num_tokens=12, request_id=6)
    assert longer5[:2] == longer6[:2] == prompt
    assert longer5[2] == _run_keys(prompt[1], 1, 5, 0, 0)[0]
    assert longer5[2] != longer6[2]


def test_num_tokens_below_the_segment_total_truncates() -> None:
    full = segment_block_keys([seg(1, 8), seg(2, 8)], block_size=BS, num_tokens=16, request_id=0)
    cut = segment_block_keys([seg(1, 8), seg(2, 8)], block_size=BS, num_tokens=11, request_id=0)
    assert cut == full[:2]


def test_keys_are_identical_in_another_process_with_another_hash_seed() -> None:
    here = segment_block_keys([seg(3, 9), seg(-4, 9)], block_size=BS, num_tokens=18, request_id=1)
    code = (
        "from dataclasses import dataclass\n"
        "from sim.serving.kv_cache import segment_block_keys\n"
        "@dataclass(frozen=True)\n"
        "class S:\n    content_id: int\n    num_tokens: int\n"
        "segs = [S(3, 9), S(-4, 9)]\n"
        "print(segment_block_keys(segs, block_size=4, num_tokens=18, request_id=1))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == repr(here)


def test_content_id_outside_int64_is_rejected() -> None:
    with pytest.raises(ValueError, match="content_id"):
        segment_block_keys([seg(1 << 63, 4)], block_size=BS, num_tokens=4, request_id=0)


# Hits and sharing


def test_second_request_with_shared_system_prompt_reuses_two_blocks() -> None:
    kv = make_cache()
    keys1, hit1 = run_prefill(kv, 1, (seg(1, 8), seg(10, 3)))
    assert hit1 == 0 and len(keys1) == 2
    assert kv.blocks_of(1) == (0, 1, 2)

    keys2, hit2 = run_prefill(kv, 2, (seg(1, 8), seg(20, 5)))
    assert keys2[:2] == keys1
    assert hit2 == 8
    assert kv.blocks_of(2) == (0, 1, 3, 4)
    assert [kv.ref_count(b) for b in range(8)] == [2, 2, 1, 1, 1, 0, 0, 0]
    assert kv.free_block_ids() == (5, 6, 7)


def test_full_prompt_hit_recomputes_the_last_block() -> None:
    kv = make_cache()
    keys, _ = run_prefill(kv, 1, (seg(1, 8),))
    kv.free(1)
    assert kv.free_block_ids() == (2, 3, 4, 5, 6, 7, 1, 0)

    assert kv.get_computed_tokens(keys, 8) == 4  # not 8: one block is recomputed
    assert kv.allocate(2, num_tokens=8, keys=keys, num_computed_tokens=4)
    assert kv.blocks_of(2) == (0, 2)  # block 1 stays cached but free; block 2 is new


def test_prompt_one_token_past_the_cached_blocks_hits_them_all() -> None:
    kv = make_cache()
    run_prefill(kv, 1, (seg(1, 8),))
    _, hit = run_prefill(kv, 2, (seg(1, 8), seg(2, 1)))
    assert hit == 8
    assert kv.blocks_of(2) == (0, 1, 2)


def test_hit_stops_at_the_first_missing_block() -> None:
    kv = make_cache()
    run_prefill(kv, 1, (seg(1, 4), seg(2, 4), seg(3, 4)))
    keys = kv.prompt_block_keys((seg(1, 4), seg(9, 4), seg(3, 4)), 2, 12)
    assert kv.get_computed_tokens(keys, 12) == 4


def test_recomputed_identical_block_is_a_duplicate_and_the_first_writer_wins() -> None:
    kv = make_cache()
    keys, _ = run_prefill(kv, 1, (seg(1, 8),))
    kv.free(1)
    assert kv.allocate(2, num_tokens=8, keys=keys, num_computed_tokens=4)
    kv.commit(2, 8, keys)
    assert kv.cached_block_id(keys[1]) == 1  # block 2 holds the same content but is not returned

    # Evicting block 1 (the first writer) makes lookups fall back to its duplicate, block 2.
    assert kv.free_block_ids() == (3, 4, 5, 6, 7, 1)
    assert kv.allocate(3, num_tokens=24, keys=(), num_computed_tokens=0)
    assert kv.blocks_of(3) == (3, 4, 5, 6, 7, 1)
    assert kv.num_evictions == 1
    assert kv.cached_block_id(keys[1]) == 2


def test_preempted_request_hits_its_own_output_blocks_when_rescheduled() -> None:
    kv = make_cache()
    segs = (seg(1, 6),)
    keys = kv.prompt_block_keys(segs, 7, 6)
    assert kv.allocate(7, num_tokens=6, keys=keys, num_computed_tokens=0)
    kv.commit(7, 6, keys)
    for n in (7, 8, 9):  # three decode steps; keys extended over the generated tokens
        assert kv.allocate(7, num_tokens=n, keys=keys, num_computed_tokens=0)
        kv.commit(7, n, kv.prompt_block_keys(segs, 7, n))
    kv.free(7)  # preempted with 9 tokens of context: 6 prompt + 3 generated

    resumed = kv.prompt_block_keys(segs, 7, 9)
    assert kv.get_computed_tokens(resumed, 9) == 8
    other = kv.prompt_block_keys(segs, 8, 9)  # same prompt, but its own output tokens
    assert kv.get_computed_tokens(other, 9) == 4


# Allocation


def test_decode_growth_takes_a_block_only_at_a_block_boundary() -> None:
    kv = make_cache()
    assert kv.allocate(1, num_tokens=5, keys=(), num_computed_tokens=0)
    assert kv.blocks_of(1) == (0, 1)
    for n in (6, 7, 8):
        assert kv.allocate(1, num_tokens=n, keys=(), num_computed_tokens=0)
    assert kv.num_free_blocks() == 6
    assert kv.allocate(1, num_tokens=9, keys=(), num_computed_tokens=0)
    assert kv.blocks_of(1) == (0, 1, 2)
    assert kv.num_blocks_held(1) == 3
    assert kv.usage_frac() == pytest.approx(3 / 8)


def test_append_one_block_gives_each_request_the_next_free_block_in_order() -> None:
    kv = make_cache()
    assert kv.allocate(1, num_tokens=4, keys=(), num_computed_tokens=0)
    assert kv.allocate(2, num_tokens=4, keys=(), num_computed_tokens=0)
    kv.append_one_block([2, 1])
    assert kv.blocks_of(1) == (0, 3) and kv.blocks_of(2) == (1, 2)
    kv.free(1)  # its run (3, 0) joins the queue tail
    kv.append_one_block([2, 2, 2, 2, 2])  # the rest of the head run, then the freed run
    assert kv.blocks_of(2) == (1, 2, 4, 5, 6, 7, 3)
    assert kv.free_block_ids() == (0,)
    assert kv.num_free_blocks() == 1


@pytest.mark.parametrize("count", [1, 3, 4, 5])
def test_append_blocks_is_append_one_block_of_one_request_repeated(count: int) -> None:
    """A lone bulk decode's blocks over several steps, taken in one call: the same ids (the head
    run's rest, then the runs behind it) and free counts as one block per step."""
    one_by_one, at_once = make_cache(), make_cache()
    for kv in (one_by_one, at_once):
        assert kv.allocate(1, num_tokens=4, keys=(), num_computed_tokens=0)
        assert kv.allocate(2, num_tokens=4, keys=(), num_computed_tokens=0)
        kv.free(1)  # block 0 queues behind the head run 2..7
    one_by_one.append_one_block([2] * count)
    at_once.append_blocks(2, count)
    assert at_once.blocks_of(2) == one_by_one.blocks_of(2)
    assert at_once.free_block_ids() == one_by_one.free_block_ids()
    assert at_once.num_free_blocks() == one_by_one.num_free_blocks()


def test_a_claimed_free_cached_block_is_skipped_when_its_old_queue_entry_comes_up() -> None:
    kv = make_cache()
    keys, _ = run_prefill(kv, 1, (seg(1, 8), seg(2, 1)))  # blocks 0, 1 cached, 2 not
    kv.free(1)
    assert kv.free_block_ids() == (3, 4, 5, 6, 7, 2, 1, 0)
    _, hit = run_prefill(kv, 2, (seg(1, 8), seg(3, 1)))  # claims the free cached blocks 0, 1
    assert hit == 8 and kv.blocks_of(2) == (0, 1, 3)
    assert kv.free_block_ids() == (4, 5, 6, 7, 2)
    kv.free(2)  # 0 and 1 are queued again, behind their stale entries
    assert kv.free_block_ids() == (4, 5, 6, 7, 2, 3, 1, 0)
    assert kv.allocate(3, num_tokens=24, keys=(), num_computed_tokens=0)
    assert kv.blocks_of(3) == (4, 5, 6, 7, 2, 3)  # the stale entries of 1 and 0 are not reused
    assert kv.free_block_ids() == (1, 0)
    assert kv.cached_block_id(keys[0]) == 0 and kv.num_evictions == 0


def test_allocation_failure_leaves_state_unchanged() -> None:
    kv = make_cache()
    keys1, _ = run_prefill(kv, 1, (seg(1, 8), seg(2, 4)))
    kv.free(1)
    run_prefill(kv, 3, (seg(9, 16),))
    assert kv.free_block_ids() == (7, 2, 1, 0)

    segs = (seg(1, 8), seg(3, 12))  # 20 tokens: 2 hit blocks (both free) + 3 new = 5 > 4 free
    keys2 = kv.prompt_block_keys(segs, 2, 20)
    assert kv.get_computed_tokens(keys2, 20) == 8
    assert not kv.allocate(2, num_tokens=20, keys=keys2, num_computed_tokens=8)
    assert kv.free_block_ids() == (7, 2, 1, 0)
    assert kv.blocks_of(2) == ()
    assert [kv.ref_count(b) for b in (0, 1, 2)] == [0, 0, 0]
    assert [kv.cached_block_id(k) for k in keys1] == [0, 1, 2]
    assert kv.num_evictions == 0


def test_evictable_hit_blocks_count_against_free_blocks() -> None:
    kv = make_cache()
    keys1, _ = run_prefill(kv, 1, (seg(1, 8), seg(2, 4)))
    kv.free(1)
    run_prefill(kv, 3, (seg(9, 16),))

    segs = (seg(1, 8), seg(3, 8))  # 16 tokens: 2 hit blocks + 2 new = 4 free blocks exactly
    keys2 = kv.prompt_block_keys(segs, 2, 16)
    assert kv.allocate(2, num_tokens=16, keys=keys2, num_computed_tokens=8)
    assert kv.blocks_of(2) == (0, 1, 7, 2)
    assert kv.num_free_blocks() == 0
    assert kv.num_evictions == 1  # block 2 held request 1's third block
    assert kv.cached_block_id(keys1[2]) is None


def test_running_request_growth_fails_without_side_effects() -> None:
    kv = make_cache()
    assert kv.allocate(1, num_tokens=28, keys=(), num_computed_tokens=0)
    assert not kv.allocate(1, num_tokens=40, keys=(), num_computed_tokens=0)
    assert kv.blocks_of(1) == (0, 1, 2, 3, 4, 5, 6)
    assert kv.free_block_ids() == (7,)


def test_claiming_a_hit_that_is_not_cached_is_an_error() -> None:
    kv = make_cache()
    keys = kv.prompt_block_keys((seg(1, 8),), 1, 8)
    with pytest.raises(ValueError, match="not cached"):
        kv.allocate(1, num_tokens=8, keys=keys, num_computed_tokens=4)
    assert kv.num_free_blocks() == 8


# Freeing and eviction order


def test_freed_cached_blocks_are_evicted_earliest_freed_first_and_tail_first() -> None:
    kv = make_cache()
    keys1, _ = run_prefill(kv, 1, (seg(1, 12),))
    keys2, _ = run_prefill(kv, 2, (seg(2, 8),))
    kv.free(1)
    kv.free(2)
    assert kv.free_block_ids() == (5, 6, 7, 2, 1, 0, 4, 3)

    assert kv.allocate(3, num_tokens=24, keys=(), num_computed_tokens=0)
    assert kv.blocks_of(3) == (5, 6, 7, 2, 1, 0)
    assert kv.num_evictions == 3
    assert [kv.cached_block_id(k) for k in keys1] == [None, None, None]
    assert [kv.cached_block_id(k) for k in keys2] == [3, 4]

    assert kv.allocate(3, num_tokens=25, keys=(), num_computed_tokens=0)
    assert kv.blocks_of(3)[-1] == 4  # request 2's tail block goes before its first block
    assert kv.get_computed_tokens(keys2, 9) == 4


def test_shared_block_returns_to_the_free_queue_only_when_its_last_holder_frees_it() -> None:
    kv = make_cache()
    run_prefill(kv, 1, (seg(1, 8), seg(10, 3)))
    run_prefill(kv, 2, (seg(1, 8), seg(20, 5)))
    kv.free(1)
    assert kv.free_block_ids() == (5, 6, 7, 2)
    assert [kv.ref_count(b) for b in (0, 1)] == [1, 1]
    kv.free(2)
    assert kv.free_block_ids() == (5, 6, 7, 2, 4, 3, 1, 0)
    assert kv.usage_frac() == 0.0


def test_freeing_an_unknown_request_does_nothing() -> None:
    kv = make_cache()
    kv.free(42)
    assert kv.num_free_blocks() == 8


# Commit


def test_commit_registers_only_full_blocks_with_keys() -> None:
    kv = make_cache()
    keys = kv.prompt_block_keys((seg(1, 10),), 1, 10)
    assert len(keys) == 2
    assert kv.allocate(1, num_tokens=6, keys=keys, num_computed_tokens=0)  # chunk of 6 tokens
    kv.commit(1, 6, keys)
    assert kv.cached_block_id(keys[0]) == 0
    assert kv.cached_block_id(keys[1]) is None  # block 1 holds 2 of 4 tokens

    assert kv.allocate(1, num_tokens=10, keys=keys, num_computed_tokens=0)
    kv.commit(1, 10, keys)
    assert kv.cached_block_id(keys[1]) == 1
    for n in (11, 12):  # decode fills block 2 with generated tokens, which have no key here
        assert kv.allocate(1, num_tokens=n, keys=keys, num_computed_tokens=0)
        kv.commit(1, n, keys)
    kv.free(1)
    longer = kv.prompt_block_keys((seg(1, 10),), 1, 13)
    assert kv.get_computed_tokens(longer, 13) == 8


def test_commit_of_tokens_beyond_the_held_blocks_is_an_error() -> None:
    kv = make_cache()
    keys = kv.prompt_block_keys((seg(1, 12),), 1, 12)
    assert kv.allocate(1, num_tokens=4, keys=keys, num_computed_tokens=0)
    with pytest.raises(ValueError, match="exceeds"):
        kv.commit(1, 8, keys)


# Prefix caching off


def test_prefix_caching_off_never_hits() -> None:
    kv = make_cache(caching=False)
    segs = (seg(1, 8), seg(2, 3))
    assert kv.prompt_block_keys(segs, 1, 11) == ()
    run_prefill(kv, 1, segs)
    kv.free(1)
    other_keys = segment_block_keys(segs, block_size=BS, num_tokens=11, request_id=2)
    assert kv.get_computed_tokens(other_keys, 11) == 0
    _, hit = run_prefill(kv, 2, segs)
    assert hit == 0
    assert kv.blocks_of(2) == (3, 4, 5)
    assert kv.cached_block_id(other_keys[0]) is None
    assert kv.num_evictions == 0


# Metrics counters


def test_prefix_query_counters_accumulate_recorded_lookups() -> None:
    kv = make_cache()
    run_prefill(kv, 1, (seg(1, 8), seg(10, 3)), record=True)
    run_prefill(kv, 2, (seg(1, 8), seg(20, 5)), record=True)
    assert kv.num_prefix_queries_tokens == 11 + 13
    assert kv.num_prefix_hit_tokens == 8


def test_constructor_rejects_nonpositive_sizes() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(num_blocks=0, block_size=4, enable_prefix_caching=True)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(num_blocks=8, block_size=0, enable_prefix_caching=True)


def test_reset_prefix_cache_leaves_a_fresh_pool_and_refuses_while_blocks_are_held() -> None:
    kv = make_cache()
    prompt = (seg(7, 3 * BS + 1),)
    run_prefill(kv, 1, prompt)
    with pytest.raises(ValueError, match="holding blocks"):
        kv.reset_prefix_cache()
    kv.free(1)
    keys, hit = run_prefill(kv, 2, prompt)
    assert hit == 3 * BS  # the freed blocks are still cached
    kv.free(2)
    kv.reset_prefix_cache()
    assert kv.get_computed_tokens(keys, 3 * BS + 1) == 0
    assert kv.num_free_blocks() == kv.num_blocks
    fresh = make_cache()
    run_prefill(kv, 3, prompt)
    run_prefill(fresh, 3, prompt)
    assert kv.blocks_of(3) == fresh.blocks_of(3)  # the same ids as a new cache hands out


def test_shared_refs_count_the_table_entries_beyond_each_blocks_first_holder() -> None:
    """Block tables hold `num_blocks - free + num_shared_refs()` entries: a hit on a block another
    request holds adds one, a hit on a free cached block none, and freeing a sharer takes it back."""
    kv = make_cache(num_blocks=16)
    prefix = (seg(1, 8),)  # two blocks
    run_prefill(kv, 0, (*prefix, seg(100, 4)))
    keys1, hit1 = run_prefill(kv, 1, (*prefix, seg(101, 4)))
    assert hit1 == 8 and kv.num_shared_refs() == 2
    assert kv.num_held_hit_blocks(keys1, hit1) == 2

    def entries() -> int:
        return sum(kv.num_blocks_held(r) for r in (0, 1, 2))

    assert entries() == kv.num_blocks - kv.num_free_blocks() + kv.num_shared_refs()
    kv.free(0)
    assert kv.num_shared_refs() == 0 and entries() == kv.num_blocks - kv.num_free_blocks()
    kv.free(1)  # the prefix blocks are now free cached blocks: a hit on them is not on held blocks
    keys2 = kv.prompt_block_keys((*prefix, seg(102, 4)), 2, 12)
    hit2 = kv.get_computed_tokens(keys2, 12)
    assert hit2 == 8 and kv.num_held_hit_blocks(keys2, hit2) == 0
    assert kv.allocate(2, num_tokens=12, keys=keys2, num_computed_tokens=hit2)
    assert kv.num_shared_refs() == 0 and entries() == kv.num_blocks - kv.num_free_blocks()
