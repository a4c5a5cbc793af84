"""Paged KV cache of one replica with vLLM v1 automatic prefix caching.

Model. The cache is `num_blocks` blocks of `block_size` token slots. A request holds a block table
(a list of block ids) covering its first `num_tokens` tokens. Requests share blocks only through
prefix-cache hits, so every block carries a reference count. Blocks with a count of zero sit in
one LRU free queue whose head is reused first. A free block can still be cached: its key stays in
the index until an allocation takes the block from the head of the queue, which evicts it.

Rules taken from vLLM v1 (vllm/v1/core/kv_cache_manager.py, block_pool.py,
single_type_kv_cache_manager.py, kv_cache_utils.py):

- Hit length (`get_computed_blocks`, `FullAttentionManager.find_longest_cache_hit`): the longest
  run of cached full-block keys from the start, capped at `num_prompt_tokens - 1` tokens rounded
  down to whole blocks, so at least one token is computed. A block-aligned prompt that hits
  entirely therefore recomputes its whole last block.
- Admission (`get_num_blocks_to_allocate`, `allocate_slots`): the blocks needed are the new blocks
  plus the hit blocks that are currently free, because touching them takes them out of the free
  queue. The call fails without side effects when that exceeds the free count, and the free count
  includes evictable cached blocks.
- New blocks come from the head of the free queue; a cached one loses its key there
  (`get_new_blocks`, `_maybe_evict_cached_block`).
- Registration (`cache_full_blocks`, `BlockHashToBlockMap`): only full blocks are registered. The
  index does not de-duplicate. A second block registered under a key it already holds is kept as a
  duplicate, and lookups return the first one registered until that one is evicted.
- Free (`SingleTypeKVCacheManager.free`, `BlockPool.free_blocks`): reference counts drop in reverse
  block order and the blocks that reach zero go to the tail of the queue. A request's tail blocks
  are therefore evicted before its prefix, and earlier-freed requests before later ones.

Departures from vLLM:

- No null block. Ids 0..num_blocks-1 are all usable. vLLM reserves block 0 as a placeholder for
  sliding-window and padding entries, which this full-attention model does not need: the caller
  passes vLLM's `num_gpu_blocks - 1` (`MemoryBreakdown.usable_kv_blocks`).
- Prompts are described by segments, not token ids. Keys are blake2b chains over int64 fields
  (`segment_block_keys`), so they are the same in every process, and the root parent is 0. vLLM
  hashes (parent, token ids, extra keys) per block from a random or seeded root. Here a run of
  blocks inside one segment shares one digest per eight blocks.
- Blocks are registered when the caller calls `commit`. vLLM registers, at allocation time, the
  blocks that the scheduled tokens will fill. Calling `commit(rid, context + new tokens, keys)`
  after a successful `allocate` and before the next lookup reproduces vLLM's behaviour, including a
  hit by a request scheduled later in the same step (`VllmV1Scheduler._admit` does so).
- There is one KV-cache group (full attention) and no sliding window, speculative lookahead,
  KV events, connectors or admission watermark.

Units: tokens and blocks, both counts. The cache never reads a clock.

Representation. A held block table is the request's indexed prefix (blocks with a key, each with a
reference count) followed by its unindexed tail (reference count 1, never shared). The free
queue holds, in LRU order, runs of unindexed blocks (lists, taken from the front) and single
indexed blocks; a hit that claims a free indexed block leaves a stale entry behind, skipped when
it reaches the head. Only indexed blocks cost Python work per block, so a request without prefix
sharing is allocated and freed in a few list operations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from sim.serving.block_keys import ROOT_KEY, SegmentLike, segment_block_keys

__all__ = ["ROOT_KEY", "BlockCountingKVCache", "KVCacheManager", "LazyBlockIdsKVCache", "SegmentLike", "kv_cache_for",
           "segment_block_keys"]


_FreeEntry = list[int] | tuple[int, int]
"""A run of unindexed free blocks, or (indexed block, stamp of its queue entry)."""


def _check_pool(num_blocks: int, block_size: int) -> None:
    if num_blocks <= 0:
        raise ValueError(f"num_blocks={num_blocks!r} must be > 0")
    if block_size <= 0:
        raise ValueError(f"block_size={block_size!r} must be > 0")


class _HeldBlocks:
    """Mutable per-request state: the block table as indexed prefix + unindexed tail."""

    __slots__ = ("indexed", "tail")

    def __init__(self, indexed: list[int], tail: list[int]) -> None:
        self.indexed = indexed
        self.tail = tail

    def num_blocks(self) -> int:
        return len(self.indexed) + len(self.tail)


class KVCacheManager:
    """Block pool, prefix index and per-request block tables of one replica.

    Call order per request: `prompt_block_keys` once, then `get_computed_tokens` and immediately
    `allocate` (the first call claims the hit blocks). In later steps, `allocate` again for the
    grown context, `commit` after each step (or right after `allocate`, as vLLM does), and
    `free` when the request finishes or is preempted. After `free`, the next `allocate` counts as
    a first call again, as it does for a resumed request in vLLM.

    Per-call work is proportional to the indexed blocks touched plus the free-queue entries
    passed; unindexed blocks move as whole lists.
    """

    __slots__ = (
        "_block_key",
        "_block_size",
        "_cached",
        "_duplicates",
        "_enable_prefix_caching",
        "_free",
        "_free_indexed",
        "_head_offset",
        "_held",
        "_num_blocks",
        "_num_free",
        "_num_shared",
        "_ref",
        "_stamp",
        "num_evictions",
        "num_prefix_hit_tokens",
        "num_prefix_queries_tokens",
    )

    def __init__(self, *, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        _check_pool(num_blocks, block_size)
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._enable_prefix_caching = enable_prefix_caching
        self._free: deque[_FreeEntry] = deque([list(range(num_blocks))])
        self._head_offset = 0
        """Blocks of the head run already taken."""
        self._num_free = num_blocks
        self._num_shared = 0
        """Block-table entries beyond each held block's first holder (`num_shared_refs`)."""
        self._free_indexed: dict[int, int] = {}
        """Indexed block in the free queue -> stamp of its live queue entry."""
        self._stamp = 0
        self._ref: dict[int, int] = {}
        """Indexed block -> reference count (0 while free). Unindexed held blocks have count 1."""
        self._block_key: dict[int, int] = {}
        """Indexed block -> its key."""
        self._cached: dict[int, int] = {}
        """Key -> the first registered block with that key (the one lookups return)."""
        self._duplicates: dict[int, list[int]] = {}
        """Key -> blocks registered later under the same key, in registration order."""
        self._held: dict[int, _HeldBlocks] = {}
        self.num_prefix_queries_tokens = 0
        """Prompt tokens passed to `record_prefix_query` (vLLM's prefix-cache 'queries')."""
        self.num_prefix_hit_tokens = 0
        """Hit tokens passed to `record_prefix_query` (vLLM's prefix-cache 'hits')."""
        self.num_evictions = 0
        """Cached blocks whose key was dropped because the block was reallocated."""

    def reset_prefix_cache(self) -> None:
        """Drop every cached block, as a freshly loaded engine starts (vLLM's `reset_prefix_cache`):
        the pool is all free and unindexed again. Only when no request holds blocks (a replica
        taken off and started again); the counters of queries, hits and evictions keep counting."""
        if self._held:
            raise ValueError(f"reset_prefix_cache with {len(self._held)} requests holding blocks")
        self._free = deque([list(range(self._num_blocks))])
        self._head_offset = 0
        self._num_free = self._num_blocks
        self._num_shared = 0
        self._free_indexed = {}
        self._ref = {}
        self._block_key = {}
        self._cached = {}
        self._duplicates = {}

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def enable_prefix_caching(self) -> bool:
        return self._enable_prefix_caching

    def prompt_block_keys(
        self, segments: Sequence[SegmentLike], request_id: int, num_prompt_tokens: int
    ) -> tuple[int, ...]:
        """Keys of the full blocks among the first `num_prompt_tokens` tokens.

        See `segment_block_keys` for how they are derived.

        Returns `()` when prefix caching is off, because nothing would use the keys.
        """
        if not self._enable_prefix_caching:
            return ()
        return segment_block_keys(
            segments,
            block_size=self._block_size,
            num_tokens=num_prompt_tokens,
            request_id=request_id,
        )

    def get_computed_tokens(self, keys: tuple[int, ...], num_prompt_tokens: int) -> int:
        """Longest cached prefix in tokens, read-only.

        Counts whole blocks only and returns at most `num_prompt_tokens - 1` tokens.
        """
        if not self._enable_prefix_caching:
            return 0
        max_blocks = (num_prompt_tokens - 1) // self._block_size
        if max_blocks > len(keys):
            max_blocks = len(keys)
        cached = self._cached
        n = 0
        while n < max_blocks and keys[n] in cached:
            n += 1
        return n * self._block_size

    def record_prefix_query(self, num_prompt_tokens: int, hit_tokens: int) -> None:
        """Count one prefix-cache lookup for metrics (vLLM's `PrefixCacheStats.record`)."""
        self.num_prefix_queries_tokens += num_prompt_tokens
        self.num_prefix_hit_tokens += hit_tokens

    def allocate(
        self, request_id: int, *, num_tokens: int, keys: tuple[int, ...], num_computed_tokens: int
    ) -> bool:
        """Make the request hold blocks for its first `num_tokens` tokens.

        The first call for a request (no blocks held) claims the `num_computed_tokens` prefix hit
        from the cache. That value must come from `get_computed_tokens` with no other cache call in
        between. Later calls ignore `keys` and `num_computed_tokens`. Returns False and changes
        nothing when the free queue, counting evictable cached blocks, is too short.
        """
        num_required = -(-num_tokens // self._block_size)
        held = self._held.get(request_id)
        if held is not None:
            num_new = num_required - len(held.indexed) - len(held.tail)
            if num_new <= 0:
                return True
            if num_new > self._num_free:
                return False
            held.tail += self._take(num_new)
            return True

        if num_computed_tokens >= num_tokens:
            raise ValueError(
                f"num_tokens={num_tokens!r} must exceed "
                f"num_computed_tokens={num_computed_tokens!r}: a step computes at least one token"
            )
        hit_ids = self._hit_block_ids(keys, num_computed_tokens)
        num_new = num_required - len(hit_ids)
        if hit_ids:
            ref = self._ref
            num_touched_free = [ref[b] for b in hit_ids].count(0)
            if num_new + num_touched_free > self._num_free:
                return False
            free_indexed = self._free_indexed
            for b in hit_ids:
                count = ref[b]
                if count == 0:
                    del free_indexed[b]  # its queue entry goes stale
                    self._num_free -= 1
                else:
                    self._num_shared += 1
                ref[b] = count + 1
        elif num_new > self._num_free:
            return False
        self._held[request_id] = _HeldBlocks(hit_ids, self._take(num_new))
        return True

    def append_one_block(self, requests: Iterable[int]) -> None:
        """Give each request, in order, one more block from the head of the free queue.

        The same as `allocate` for a context that grows into a new block, without the checks:
        every request must hold blocks and the caller must have checked the free count. This is
        the per-step block growth of decodes run in bulk.
        """
        ids = requests if isinstance(requests, list) else list(requests)
        n = len(ids)
        if not n:
            return
        held = self._held
        head = self._free[0]
        offset = self._head_offset
        if type(head) is list and offset + n < len(head):
            # The common case: the head run has enough unindexed blocks for everyone (in a bulk
            # decode step, one or two requests).
            self._head_offset = offset + n
            self._num_free -= n
            if n == 1:
                held[ids[0]].tail.append(head[offset])
                return
            for b, request_id in enumerate(ids, offset):
                held[request_id].tail.append(head[b])
            return
        # Taking them all at once gives each request the block it would take alone, in order.
        for request_id, b in zip(ids, self._take(len(ids)), strict=True):
            held[request_id].tail.append(b)

    def append_blocks(self, request_id: int, count: int) -> None:
        """`append_one_block([request_id] * count)`: `count` more blocks for one request (the
        block growth of a lone bulk decode over several steps)."""
        if count <= 0:
            return
        head = self._free[0]
        offset = self._head_offset
        tail = self._held[request_id].tail
        if type(head) is list and offset + count < len(head):
            self._head_offset = offset + count
            self._num_free -= count
            tail.extend(head[offset:offset + count])
            return
        tail.extend(self._take(count))

    def commit(self, request_id: int, num_computed_tokens: int, keys: tuple[int, ...]) -> None:
        """Index the request's blocks that are full within `num_computed_tokens` and have a key.

        Does nothing when prefix caching is off. A key that is already indexed keeps its first
        block; the new block is recorded as a duplicate, as in vLLM.
        """
        if not self._enable_prefix_caching:
            return
        held = self._held.get(request_id)
        if held is None:
            raise ValueError(f"request_id={request_id!r} holds no blocks; allocate it first")
        num_full = num_computed_tokens // self._block_size
        if num_full > held.num_blocks():
            raise ValueError(
                f"num_computed_tokens={num_computed_tokens!r} exceeds the {held.num_blocks()} blocks "
                f"held by request_id={request_id!r}"
            )
        if num_full > len(keys):
            num_full = len(keys)
        start = len(held.indexed)
        if num_full <= start:
            return
        tail = held.tail
        newly = tail[:num_full - start]
        del tail[:num_full - start]
        block_key = self._block_key
        ref = self._ref
        cached = self._cached
        for b, key in zip(newly, keys[start:num_full], strict=True):
            block_key[b] = key
            ref[b] = 1
            if cached.setdefault(key, b) != b:
                self._duplicates.setdefault(key, []).append(b)
        held.indexed += newly

    def free(self, request_id: int) -> None:
        """Release the request's blocks.

        Blocks whose reference count reaches zero join the tail of the free queue, last block
        first. A request that holds no blocks is ignored.
        """
        held = self._held.pop(request_id, None)
        if held is None:
            return
        tail = held.tail
        if tail:
            tail.reverse()
            self._free.append(tail)
            self._num_free += len(tail)
        ref = self._ref
        for b in reversed(held.indexed):
            count = ref[b] - 1
            ref[b] = count
            if count:
                self._num_shared -= 1
            else:
                self._stamp += 1
                self._free_indexed[b] = self._stamp
                self._free.append((b, self._stamp))
                self._num_free += 1

    def num_free_blocks(self) -> int:
        """Free blocks, including cached blocks that can still be evicted."""
        return self._num_free

    def num_blocks_held(self, request_id: int) -> int:
        held = self._held.get(request_id)
        return 0 if held is None else held.num_blocks()

    def num_shared_refs(self) -> int:
        """Block-table entries that share a block with another request: the sum over held blocks of
        (holders - 1). The requests' tables hold `num_blocks - num_free_blocks()` + this many blocks."""
        return self._num_shared

    def num_held_hit_blocks(self, keys: tuple[int, ...], num_hit_tokens: int) -> int:
        """Of the blocks a prefix hit of `num_hit_tokens` (from `get_computed_tokens`) would claim,
        those some request holds now (the others are free cached blocks, which a hit takes from
        the free queue)."""
        if not num_hit_tokens:
            return 0
        get, ref = self._cached.get, self._ref
        return sum(1 for key in keys[:num_hit_tokens // self._block_size] if ref[get(key, -1)] > 0)

    def usage_frac(self) -> float:
        """Fraction of blocks referenced by at least one request."""
        return (self._num_blocks - self._num_free) / self._num_blocks

    def blocks_of(self, request_id: int) -> tuple[int, ...]:
        """The request's block table (empty if it holds none)."""
        held = self._held.get(request_id)
        return () if held is None else (*held.indexed, *held.tail)

    def ref_count(self, block_id: int) -> int:
        """Requests holding the block (for tests: scans the block tables of unindexed blocks)."""
        count = self._ref.get(block_id)
        if count is not None:
            return count
        return sum(1 for held in self._held.values() if block_id in held.tail)

    def cached_block_id(self, key: int) -> int | None:
        """The block a lookup of `key` returns, or None if the key is not indexed."""
        return self._cached.get(key)

    def free_block_ids(self) -> tuple[int, ...]:
        """Free blocks in eviction order, the next one to be reused first (for tests)."""
        out: list[int] = []
        offset = self._head_offset
        for entry in self._free:
            if type(entry) is list:
                out += entry[offset:]
            elif self._free_indexed.get(entry[0]) == entry[1]:
                out.append(entry[0])
            offset = 0
        return tuple(out)

    def _hit_block_ids(self, keys: tuple[int, ...], num_computed_tokens: int) -> list[int]:
        if num_computed_tokens == 0:
            return []
        num_hit_blocks, rest = divmod(num_computed_tokens, self._block_size)
        if not self._enable_prefix_caching or rest or num_hit_blocks > len(keys):
            raise ValueError(
                f"num_computed_tokens={num_computed_tokens!r} is not a prefix hit of "
                f"{len(keys)} keys at block_size={self._block_size} with prefix caching "
                f"{'on' if self._enable_prefix_caching else 'off'}"
            )
        get = self._cached.get
        hit_ids = [get(key, -1) for key in keys[:num_hit_blocks]]
        if -1 in hit_ids:
            raise ValueError(
                f"block {hit_ids.index(-1)} of the claimed {num_computed_tokens}-token hit is not "
                "cached; call get_computed_tokens right before allocate"
            )
        return hit_ids

    def _take(self, num_new: int) -> list[int]:
        """Take `num_new` blocks from the queue head (the caller checked the free count),
        evicting the keys of indexed ones."""
        taken: list[int] = []
        if num_new <= 0:
            return taken
        free = self._free
        self._num_free -= num_new
        while num_new:
            head = free[0]
            if type(head) is list:
                offset = self._head_offset
                available = len(head) - offset
                if available > num_new:
                    taken += head[offset:offset + num_new]
                    self._head_offset = offset + num_new
                    break
                taken += head[offset:] if offset else head
                free.popleft()
                self._head_offset = 0
                num_new -= available
                continue
            free.popleft()
            b, stamp = head
            if self._free_indexed.get(b) != stamp:
                continue  # claimed by a hit since it was queued
            del self._free_indexed[b]
            self._evict(b)
            taken.append(b)
            num_new -= 1
        return taken

    def _evict(self, block_id: int) -> None:
        """Drop a free indexed block from the index as it is reused."""
        key = self._block_key.pop(block_id)
        del self._ref[block_id]
        self.num_evictions += 1
        if key not in self._duplicates:  # block_id is the only block with this key
            del self._cached[key]
            return
        duplicates = self._duplicates[key]
        if self._cached[key] == block_id:
            self._cached[key] = duplicates.pop(0)
        else:
            duplicates.remove(block_id)
        if not duplicates:
            del self._duplicates[key]


class BlockCountingKVCache(KVCacheManager):
    """The block pool of a replica without prefix caching: how many blocks each request holds.

    Without prefix caching no block is looked up, shared or evicted, so which ids a request holds
    never reaches a result: the scheduler sees the same free counts and the same successes and
    failures of `allocate` as with `KVCacheManager` (the same rules, on counts), at one dict
    update per grown request instead of moving block ids through the free queue. The block-id
    helpers (`blocks_of`, `free_block_ids`, `ref_count`) have no ids to show and say so.

    `_held` maps a request to its block count (no slot of its own: `LazyBlockIdsKVCache` counts with
    these methods and then takes `KVCacheManager`'s class, which needs the same slots).
    """

    __slots__ = ()

    def __init__(self, *, num_blocks: int, block_size: int) -> None:
        _check_pool(num_blocks, block_size)
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._enable_prefix_caching = False
        self._num_free = num_blocks
        self._held = {}
        self.num_prefix_queries_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_evictions = 0

    def reset_prefix_cache(self) -> None:
        """Nothing is cached without prefix caching; the pool is all free once no request holds blocks."""
        if self._held:
            raise ValueError(f"reset_prefix_cache with {len(self._held)} requests holding blocks")

    def allocate(
        self, request_id: int, *, num_tokens: int, keys: tuple[int, ...], num_computed_tokens: int
    ) -> bool:
        """As `KVCacheManager.allocate`; `keys` and a zero `num_computed_tokens` are not used (no
        prefix cache, so nothing is ever hit)."""
        counts: dict[int, int] = self._held  # type: ignore[assignment]
        num_required = -(-num_tokens // self._block_size)
        held = counts.get(request_id)
        if held is not None:
            num_new = num_required - held
            if num_new <= 0:
                return True
            if num_new > self._num_free:
                return False
            counts[request_id] = num_required
            self._num_free -= num_new
            return True
        if num_computed_tokens >= num_tokens:
            raise ValueError(
                f"num_tokens={num_tokens!r} must exceed "
                f"num_computed_tokens={num_computed_tokens!r}: a step computes at least one token"
            )
        if num_computed_tokens:
            raise ValueError(
                f"num_computed_tokens={num_computed_tokens!r} claims a prefix-cache hit, but prefix "
                "caching is off"
            )
        if num_required > self._num_free:
            return False
        counts[request_id] = num_required
        self._num_free -= num_required
        return True

    def append_one_block(self, requests: Iterable[int]) -> None:
        """As `KVCacheManager.append_one_block`: one more block for each request."""
        counts: dict[int, int] = self._held  # type: ignore[assignment]
        n = 0
        for request_id in requests:
            counts[request_id] += 1
            n += 1
        self._num_free -= n

    def append_blocks(self, request_id: int, count: int) -> None:
        """As `KVCacheManager.append_blocks`: `count` more blocks for one request."""
        if count > 0:
            counts: dict[int, int] = self._held  # type: ignore[assignment]
            counts[request_id] += count
            self._num_free -= count

    def free(self, request_id: int) -> None:
        """Release the request's blocks (a request that holds none is ignored)."""
        counts: dict[int, int] = self._held  # type: ignore[assignment]
        held = counts.pop(request_id, None)
        if held is not None:
            self._num_free += held

    def num_blocks_held(self, request_id: int) -> int:
        counts: dict[int, int] = self._held  # type: ignore[assignment]
        return counts.get(request_id, 0)

    def num_shared_refs(self) -> int:
        return 0  # no block is ever shared without prefix caching

    def num_held_hit_blocks(self, keys: tuple[int, ...], num_hit_tokens: int) -> int:
        return 0

    def blocks_of(self, request_id: int) -> tuple[int, ...]:
        raise TypeError("block ids are not tracked without prefix caching (BlockCountingKVCache)")

    def ref_count(self, block_id: int) -> int:
        raise TypeError("block ids are not tracked without prefix caching (BlockCountingKVCache)")

    def free_block_ids(self) -> tuple[int, ...]:
        raise TypeError("block ids are not tracked without prefix caching (BlockCountingKVCache)")

    def cached_block_id(self, key: int) -> int | None:
        return None


class LazyBlockIdsKVCache(BlockCountingKVCache):
    """`KVCacheManager` with prefix caching that counts each request's blocks (as
    `BlockCountingKVCache`) until a commit first indexes a block, and only then gives the blocks ids
    and becomes a `KVCacheManager` (its class is reassigned: the same slots).

    While no block is indexed, block ids reach no result: no lookup can hit, nothing is evicted, and
    the free queue is all unindexed blocks, which are interchangeable. So ids assigned at the first
    index (each holder's blocks numbered in turn, the rest one free run) give a cache that is the
    `KVCacheManager` of the same calls up to a renaming of blocks: the same hits, evictions, free
    counts and allocation results from then on. A workload whose prompts share no prefix and that
    preempts nothing never indexes a block and never pays for block ids. The block-id helpers
    (`blocks_of`, `free_block_ids`, `ref_count`) assign the ids first; `cached_block_id` is None
    (nothing is indexed).

    While counting it is a `BlockCountingKVCache` (its counting methods: block growth, frees, counts;
    no block is shared, so no shared references or held hit blocks) with `KVCacheManager`'s state
    kept for the switch.
    """

    __slots__ = ()

    def __init__(self, *, num_blocks: int, block_size: int) -> None:
        KVCacheManager.__init__(self, num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=True)

    def _assign_ids(self) -> None:
        """Give the held blocks ids (each request's in turn, from 0) and the rest one free run; from
        here on this is a `KVCacheManager`."""
        counts: dict[int, int] = self._held  # type: ignore[assignment]
        held: dict[int, _HeldBlocks] = {}
        next_id = 0
        for request_id, count in counts.items():
            held[request_id] = _HeldBlocks([], list(range(next_id, next_id + count)))
            next_id += count
        self._held = held
        self._free = deque([list(range(next_id, self._num_blocks))] if next_id < self._num_blocks else [])
        self._head_offset = 0
        self.__class__ = KVCacheManager  # type: ignore[assignment]

    def get_computed_tokens(self, keys: tuple[int, ...], num_prompt_tokens: int) -> int:
        return 0  # nothing is indexed yet

    def allocate(
        self, request_id: int, *, num_tokens: int, keys: tuple[int, ...], num_computed_tokens: int
    ) -> bool:
        if num_computed_tokens:  # a hit claim, with nothing indexed: `KVCacheManager` says why it is wrong
            self._assign_ids()
            return self.allocate(request_id, num_tokens=num_tokens, keys=keys,
                                 num_computed_tokens=num_computed_tokens)
        return BlockCountingKVCache.allocate(self, request_id, num_tokens=num_tokens, keys=keys,
                                             num_computed_tokens=0)

    def commit(self, request_id: int, num_computed_tokens: int, keys: tuple[int, ...]) -> None:
        counts: dict[int, int] = self._held  # type: ignore[assignment]
        held = counts.get(request_id)
        if held is None or num_computed_tokens // self._block_size > held:
            self._assign_ids()  # `KVCacheManager.commit` raises
        elif not keys or num_computed_tokens < self._block_size:
            return  # indexes nothing
        else:
            self._assign_ids()
        self.commit(request_id, num_computed_tokens, keys)

    def reset_prefix_cache(self) -> None:
        self._assign_ids()
        self.reset_prefix_cache()

    def blocks_of(self, request_id: int) -> tuple[int, ...]:
        self._assign_ids()
        return self.blocks_of(request_id)

    def ref_count(self, block_id: int) -> int:
        self._assign_ids()
        return self.ref_count(block_id)

    def free_block_ids(self) -> tuple[int, ...]:
        self._assign_ids()
        return self.free_block_ids()


def kv_cache_for(*, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> KVCacheManager:
    """The KV cache of one engine rank: block tables and the prefix index with prefix caching,
    block counts without (the same schedule either way, `BlockCountingKVCache`)."""
    if enable_prefix_caching:
        return LazyBlockIdsKVCache(num_blocks=num_blocks, block_size=block_size)
    return BlockCountingKVCache(num_blocks=num_blocks, block_size=block_size)
