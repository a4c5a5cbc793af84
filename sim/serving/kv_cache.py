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
  sliding-window and padding entries, which this full-attention model does not need. To match a
  vLLM run with `num_gpu_blocks` blocks, pass `num_gpu_blocks - 1`.
- Prompts are described by segments, not token ids. Keys are blake2b chains over int64 fields
  (`segment_block_keys`), so they are the same in every process, and the root parent is 0. vLLM
  hashes (parent, token ids, extra keys) per block from a random or seeded root. Here a run of
  blocks inside one segment shares one digest per eight blocks.
- Blocks are registered when the caller calls `commit`. vLLM registers, at allocation time, the
  blocks that the scheduled tokens will fill. Calling `commit(rid, context + new tokens, keys)`
  right after a successful `allocate` reproduces vLLM's behaviour, including a hit by a request
  scheduled later in the same step.
- There is one KV-cache group (full attention) and no sliding window, speculative lookahead,
  KV events, connectors or admission watermark.

Units: tokens and blocks, both counts. The cache never reads a clock.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence
from hashlib import blake2b
from typing import Final, Protocol

__all__ = ["ROOT_KEY", "KVCacheManager", "SegmentLike", "segment_block_keys"]

ROOT_KEY: Final = 0
"""Parent key of a prompt's first block."""

_NO_KEY: Final = -1
"""Marks a block that is not in the cache index (real keys are unsigned 64-bit)."""

_SEGMENT_TAG: Final = 0
_OUTPUT_TAG: Final = 1
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_RUN_HEADER: Final = struct.Struct("<Q4qQ")
"""Parent of a run, tag, id, first offset, block size, chunk index (48 bytes)."""
_EIGHT_KEYS: Final = struct.Struct("<8Q")
"""One 64-byte blake2b digest read as the keys of eight consecutive blocks."""
_FIRST_KEY: Final = struct.Struct("<Q")


class SegmentLike(Protocol):
    """A run of prompt tokens: equal `content_id` means identical tokens (see workload.Segment)."""

    @property
    def content_id(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...


def segment_block_keys(
    segments: Sequence[SegmentLike], *, block_size: int, num_tokens: int, request_id: int
) -> tuple[int, ...]:
    """Prefix-cache keys of the full blocks among the first `num_tokens` tokens.

    Each block's content is a list of pieces `(tag, id, start, length)`. A piece of a segment is
    `(0, content_id, start offset within the segment, length)`. A content id names a token stream,
    so a segment holds the first `num_tokens` tokens of that stream. Tokens past the end of the
    segments are the request's own generated tokens and become pieces
    `(1, request_id, start offset within the output, length)`. Such a key is never shared with
    another request, but it lets a preempted request hit its own surviving blocks when it is
    rescheduled.

    Hashing is blake2b over int64 fields, so keys are unsigned 64-bit integers that are the same in
    every process. `ROOT_KEY` is the parent of the first block. Blocks come in two forms:

    - A block that spans two or more pieces: `blake2b(parent, pieces...)`, first 8 bytes.
    - A maximal run of consecutive blocks inside one piece stream: one digest per eight blocks,
      `blake2b(run parent, tag, id, first offset, block_size, chunk index)`, read as eight keys.
      This is 5-7x faster than one digest per block.

    Both forms make key i a function of the content of blocks 0..i alone. Where a run starts is
    fixed by that content: at a segment's first whole block, or after a block that spans pieces.
    Equal prefixes therefore get equal keys, and different prefixes collide only if blake2b does.
    Partial trailing blocks get no key.
    """
    if block_size <= 0:
        raise ValueError(f"block_size={block_size!r} must be > 0")
    if num_tokens < 0:
        raise ValueError(f"num_tokens={num_tokens!r} must be >= 0")
    runs: list[tuple[int, int, int]] = []
    total_tokens = 0
    for seg in segments:
        cid, n = seg.content_id, seg.num_tokens
        if n < 0:
            raise ValueError(f"segment num_tokens={n!r} must be >= 0")
        if not _I64_MIN <= cid <= _I64_MAX:
            raise ValueError(f"content_id={cid!r} must fit in a signed 64-bit integer")
        runs.append((_SEGMENT_TAG, cid, n))
        total_tokens += n
    if num_tokens > total_tokens:
        if not _I64_MIN <= request_id <= _I64_MAX:
            raise ValueError(f"request_id={request_id!r} must fit in a signed 64-bit integer")
        runs.append((_OUTPUT_TAG, request_id, num_tokens - total_tokens))

    pack_header = _RUN_HEADER.pack
    unpack_eight = _EIGHT_KEYS.unpack
    keys: list[int] = []
    parent = ROOT_KEY
    open_pieces: list[int] = []  # flattened pieces of the block being filled
    open_tokens = 0
    remaining = num_tokens
    for tag, ident, run_tokens in runs:
        n = min(run_tokens, remaining)
        if n <= 0:
            if remaining <= 0:
                break
            continue
        remaining -= n
        offset = 0
        if open_tokens:
            take = min(block_size - open_tokens, n)
            open_pieces += (tag, ident, 0, take)
            open_tokens += take
            offset = take
            if open_tokens == block_size:
                data = struct.pack(f"<Q{len(open_pieces)}q", parent, *open_pieces)
                parent = _FIRST_KEY.unpack_from(blake2b(data).digest())[0]
                keys.append(parent)
                open_pieces = []
                open_tokens = 0
        num_whole = (n - offset) // block_size
        if num_whole:
            num_kept = len(keys) + num_whole
            for chunk in range((num_whole + 7) // 8):
                header = pack_header(parent, tag, ident, offset, block_size, chunk)
                keys += unpack_eight(blake2b(header).digest())
            del keys[num_kept:]
            parent = keys[-1]
            offset += num_whole * block_size
        if offset < n:
            open_pieces = [tag, ident, offset, n - offset]
            open_tokens = n - offset
    return tuple(keys)


class _HeldBlocks:
    """Mutable per-request state: the block table and how many of its blocks are indexed."""

    __slots__ = ("block_ids", "num_cached")

    def __init__(self, block_ids: list[int], num_cached: int) -> None:
        self.block_ids = block_ids
        self.num_cached = num_cached


class KVCacheManager:
    """Block pool, prefix index and per-request block tables of one replica.

    Call order per request: `prompt_block_keys` once, then `get_computed_tokens` and immediately
    `allocate` (the first call claims the hit blocks). In later steps, `allocate` again for the
    grown context, `commit` after each step (or right after `allocate`, as vLLM does), and
    `free` when the request finishes or is preempted. After `free`, the next `allocate` counts as
    a first call again, as it does for a resumed request in vLLM.

    All per-call work is proportional to the blocks touched. The free queue is an `OrderedDict`
    used as an O(1) linked list in LRU order.
    """

    __slots__ = (
        "_block_key",
        "_block_size",
        "_cached",
        "_duplicates",
        "_enable_prefix_caching",
        "_free",
        "_held",
        "_num_blocks",
        "_ref",
        "num_evictions",
        "num_prefix_hit_tokens",
        "num_prefix_queries_tokens",
    )

    def __init__(self, *, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks={num_blocks!r} must be > 0")
        if block_size <= 0:
            raise ValueError(f"block_size={block_size!r} must be > 0")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._block_key = [_NO_KEY] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
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
            blocks = held.block_ids
            num_new = num_required - len(blocks)
            if num_new <= 0:
                return True
            if num_new > len(self._free):
                return False
            self._take_free(blocks, num_new)
            return True

        if num_computed_tokens >= num_tokens:
            raise ValueError(
                f"num_tokens={num_tokens!r} must exceed "
                f"num_computed_tokens={num_computed_tokens!r}: a step computes at least one token"
            )
        hit_ids = self._hit_block_ids(keys, num_computed_tokens)
        ref = self._ref
        num_new = num_required - len(hit_ids)
        num_touched_free = [ref[b] for b in hit_ids].count(0)
        if num_new + num_touched_free > len(self._free):
            return False
        free = self._free
        for b in hit_ids:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1
        self._take_free(hit_ids, num_new)
        self._held[request_id] = _HeldBlocks(hit_ids, num_computed_tokens // self._block_size)
        return True

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
        blocks = held.block_ids
        num_full = num_computed_tokens // self._block_size
        if num_full > len(blocks):
            raise ValueError(
                f"num_computed_tokens={num_computed_tokens!r} exceeds the {len(blocks)} blocks "
                f"held by request_id={request_id!r}"
            )
        if num_full > len(keys):
            num_full = len(keys)
        start = held.num_cached
        if num_full <= start:
            return
        block_key = self._block_key
        cached = self._cached
        for b, key in zip(blocks[start:num_full], keys[start:num_full], strict=True):
            block_key[b] = key
            if cached.setdefault(key, b) != b:
                self._duplicates.setdefault(key, []).append(b)
        held.num_cached = num_full

    def free(self, request_id: int) -> None:
        """Release the request's blocks.

        Blocks whose reference count reaches zero join the tail of the free queue, last block
        first. A request that holds no blocks is ignored.
        """
        held = self._held.pop(request_id, None)
        if held is None:
            return
        ref = self._ref
        free = self._free
        for b in reversed(held.block_ids):
            count = ref[b] - 1
            ref[b] = count
            if count == 0:
                free[b] = None

    def num_free_blocks(self) -> int:
        """Free blocks, including cached blocks that can still be evicted."""
        return len(self._free)

    def num_blocks_held(self, request_id: int) -> int:
        held = self._held.get(request_id)
        return 0 if held is None else len(held.block_ids)

    def usage_frac(self) -> float:
        """Fraction of blocks referenced by at least one request."""
        return (self._num_blocks - len(self._free)) / self._num_blocks

    def blocks_of(self, request_id: int) -> tuple[int, ...]:
        """The request's block table (empty if it holds none)."""
        held = self._held.get(request_id)
        return () if held is None else tuple(held.block_ids)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def cached_block_id(self, key: int) -> int | None:
        """The block a lookup of `key` returns, or None if the key is not indexed."""
        return self._cached.get(key)

    def free_block_ids(self) -> tuple[int, ...]:
        """Free blocks in eviction order, the next one to be reused first (for tests)."""
        return tuple(self._free)

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

    def _take_free(self, blocks: list[int], num_new: int) -> None:
        """Move `num_new` blocks from the queue head to `blocks`, evicting their keys."""
        popitem = self._free.popitem
        taken = [popitem(False)[0] for _ in range(num_new)]
        ref = self._ref
        block_key = self._block_key
        cached = self._cached
        duplicates = self._duplicates
        for b in taken:
            ref[b] = 1
            key = block_key[b]
            if key != _NO_KEY:
                block_key[b] = _NO_KEY
                self.num_evictions += 1
                if key in duplicates:
                    self._evict_shared_key(b, key)
                else:  # b is the only block with this key
                    del cached[key]
        blocks += taken

    def _evict_shared_key(self, block_id: int, key: int) -> None:
        """Drop `block_id` from the index when other blocks hold the same key."""
        duplicates = self._duplicates[key]
        if self._cached[key] == block_id:
            self._cached[key] = duplicates.pop(0)
        else:
            duplicates.remove(block_id)
        if not duplicates:
            del self._duplicates[key]
