"""`LazyBlockIdsKVCache` answers every call as `KVCacheManager` does (block ids aside: the same up to
a renaming), before and after its first indexed block."""

from __future__ import annotations

import random

import pytest

from sim.serving.kv_cache import KVCacheManager, LazyBlockIdsKVCache, kv_cache_for


def _drive(kv: KVCacheManager, seed: int, index_from: int) -> list[object]:
    """A random sequence of scheduler-like calls; requests from `index_from` on have prefix keys."""
    rng = random.Random(seed)
    bs = kv.block_size
    out: list[object] = []
    live: dict[int, int] = {}  # request -> tokens held
    keys_of: dict[int, tuple[int, ...]] = {}
    for step in range(400):
        op = rng.random()
        if op < 0.35 or not live:
            rid = step
            tokens = rng.randint(1, 6 * bs)
            keys = tuple(range(1000 + rng.randint(0, 2), 1000 + tokens // bs)) if rid >= index_from else ()
            hit = kv.get_computed_tokens(keys, tokens)
            ok = kv.allocate(rid, num_tokens=tokens, keys=keys, num_computed_tokens=hit)
            out.append(("alloc", hit, ok))
            if ok:
                live[rid] = tokens
                keys_of[rid] = keys
                kv.commit(rid, tokens, keys)
        elif op < 0.6:
            ids = [r for r in live if rng.random() < 0.5 and live[r] % bs == 0]
            if len(ids) <= kv.num_free_blocks():
                kv.append_one_block(ids)
                for r in ids:
                    live[r] += 1
            out.append(("grow", len(ids)))
        elif op < 0.7:
            rid = rng.choice(list(live))
            count = rng.randint(0, 2)
            if count <= kv.num_free_blocks():
                kv.append_blocks(rid, count)
                live[rid] += count * bs
        elif op < 0.8:
            rid = rng.choice(list(live))
            ok = kv.allocate(rid, num_tokens=live[rid] + rng.randint(1, 2 * bs), keys=keys_of[rid],
                             num_computed_tokens=0)
            out.append(("regrow", ok))
        else:
            rid = rng.choice(list(live))
            kv.free(rid)
            del live[rid]
        out.append((kv.num_free_blocks(), kv.usage_frac(), kv.num_evictions,
                    tuple(kv.num_blocks_held(r) for r in sorted(live))))
    return out


@pytest.mark.parametrize("index_from", [0, 150, 10_000])
@pytest.mark.parametrize("seed", range(4))
def test_lazy_ids_match_block_tables(seed: int, index_from: int) -> None:
    lazy = kv_cache_for(num_blocks=64, block_size=4, enable_prefix_caching=True)
    assert isinstance(lazy, LazyBlockIdsKVCache)
    ref = KVCacheManager(num_blocks=64, block_size=4, enable_prefix_caching=True)
    assert _drive(lazy, seed, index_from) == _drive(ref, seed, index_from)
    # Once the ids exist the tables are the reference's up to a renaming of blocks.
    assert len(lazy.free_block_ids()) == len(ref.free_block_ids())
    assert type(lazy) is KVCacheManager


def test_lazy_ids_assigned_on_first_index() -> None:
    kv = LazyBlockIdsKVCache(num_blocks=8, block_size=4)
    assert kv.allocate(1, num_tokens=9, keys=(), num_computed_tokens=0)
    kv.commit(1, 9, ())
    assert type(kv) is LazyBlockIdsKVCache and kv.num_blocks_held(1) == 3
    assert kv.allocate(2, num_tokens=8, keys=(5, 6), num_computed_tokens=0)
    kv.commit(2, 8, (5, 6))
    assert type(kv) is KVCacheManager
    assert kv.blocks_of(1) == (0, 1, 2) and kv.blocks_of(2) == (3, 4) and kv.cached_block_id(6) == 4
    with pytest.raises(ValueError):
        LazyBlockIdsKVCache(num_blocks=8, block_size=4).commit(3, 4, (1,))
