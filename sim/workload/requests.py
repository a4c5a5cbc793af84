"""What one simulated request asks for: when it arrives, its prompt content and its output length.

A prompt is a sequence of segments. A segment is the first `num_tokens` tokens of a content
stream named by an integer `content_id`: two segments with the same id hold the same tokens over
their common length, which is what prefix caching matches on. Ids are plain ints, never string
hashes, so they are equal in every process.

Content ids are assigned by one rule: the shared prefix of prefix group `g` is stream `g + 1`
(small ints), and the content unique to request `r` is stream `2**32 + r`. `build_requests`
makes a workload's requests from column arrays; synthetic and trace workloads both use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from sim.serde import require

UNIQUE_CONTENT_BASE: Final = 1 << 32
"""Request-unique content ids start here; shared-prefix ids stay below it."""

MAX_PREFIX_GROUP: Final = UNIQUE_CONTENT_BASE - 1


def prefix_content_id(prefix_group: int) -> int:
    """Content id of the shared prefix of `prefix_group`."""
    return prefix_group + 1


def unique_content_id(request_id: int) -> int:
    """Content id of the prompt tokens that only `request_id` has."""
    return UNIQUE_CONTENT_BASE + request_id


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """A run of prompt tokens taken from the start of one content stream."""

    content_id: int
    """Equal ids mean identical token content (prefix caching matches on it)."""
    num_tokens: int

    def __post_init__(self) -> None:
        if self.content_id >= 0 and self.num_tokens >= 1:
            return
        require(self.content_id >= 0, "content_id", self.content_id, "must be >= 0")
        require(self.num_tokens >= 1, "num_tokens", self.num_tokens, "must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSpec:
    """One request of a workload, as the client sends it."""

    request_id: int
    """Position in the workload, 0-based; also the arrival order."""
    arrival_s: float
    """Seconds from the run start; 0.0 for all requests when `request_rate` is inf."""
    prompt_tokens: int
    output_tokens: int
    """Tokens generated before the request finishes (outputs run to length, as `--ignore-eos`)."""
    segments: tuple[Segment, ...]
    """Prompt content in order; token counts sum to `prompt_tokens`; a shared prefix comes first."""
    prefix_group: int = -1
    """Shared-prefix group; -1 means the prompt shares no prefix."""

    def __post_init__(self) -> None:
        # One combined test on the common path: workloads build 10^5 of these.
        segments = self.segments
        total_tokens = 0
        for segment in segments:
            total_tokens += segment.num_tokens
        group = self.prefix_group
        if (
            self.request_id >= 0
            and 0.0 <= self.arrival_s < math.inf
            and self.prompt_tokens >= 1
            and self.output_tokens >= 1
            and total_tokens == self.prompt_tokens
            and (group == -1 or (0 <= group < MAX_PREFIX_GROUP
                                 and segments[0].content_id == group + 1))
        ):
            return
        require(self.request_id >= 0, "request_id", self.request_id, "must be >= 0")
        require(math.isfinite(self.arrival_s) and self.arrival_s >= 0.0, "arrival_s",
                self.arrival_s, "must be a finite number >= 0")
        require(self.prompt_tokens >= 1, "prompt_tokens", self.prompt_tokens, "must be >= 1")
        require(self.output_tokens >= 1, "output_tokens", self.output_tokens, "must be >= 1")
        require(total_tokens == self.prompt_tokens, "segments", segments,
                f"token counts must sum to prompt_tokens={self.prompt_tokens}")
        require(-1 <= group < MAX_PREFIX_GROUP, "prefix_group", group,
                f"must be -1 or in [0, {MAX_PREFIX_GROUP})")
        require(segments[0].content_id == prefix_content_id(group), "segments", segments,
                f"must start with the prefix segment content_id={prefix_content_id(group)}")

    def prefix_tokens(self) -> int:
        """Length of the shared prefix; 0 when the request has none."""
        return self.segments[0].num_tokens if self.prefix_group >= 0 else 0


class _SegmentSlots:
    """`Segment`'s slots under a plain class: `build_requests` stores a segment's fields as plain slot
    stores, gives the object its real class (the same slots, so `__class__` may be assigned) and runs
    its check. A frozen dataclass's `__init__` sets each field through `object.__setattr__` and a
    keyword call to a class first builds a dict of its arguments (~2.5x the instructions)."""

    __slots__ = Segment.__slots__

    def __init__(self, content_id: int, num_tokens: int) -> None:
        self.content_id = content_id
        self.num_tokens = num_tokens
        self.__class__ = Segment  # type: ignore[assignment]
        self.__post_init__()  # type: ignore[attr-defined]


class _RequestSpecSlots:
    """`RequestSpec` built as `_SegmentSlots` builds a `Segment`."""

    __slots__ = RequestSpec.__slots__

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 segments: tuple[Segment, ...], prefix_group: int) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.segments = segments
        self.prefix_group = prefix_group
        self.__class__ = RequestSpec  # type: ignore[assignment]
        self.__post_init__()  # type: ignore[attr-defined]


_new_segment = cast(Callable[[int, int], Segment], _SegmentSlots)
_new_request_spec = cast(Callable[[int, float, int, int, tuple[Segment, ...], int], RequestSpec], _RequestSpecSlots)


def build_requests(
    *,
    arrivals_s: npt.NDArray[np.float64],
    prompt_tokens: npt.NDArray[np.int64],
    output_tokens: npt.NDArray[np.int64],
    prefix_groups: npt.NDArray[np.int64],
    prefix_tokens: npt.NDArray[np.int64],
) -> tuple[RequestSpec, ...]:
    """Requests 0..n-1 from column arrays; a prefix segment exists where prefix_tokens > 0.

    Segments with equal (group, length) are one shared object. The loop is the cost of
    generation (about 1-3 us a request); everything before it is vectorised.
    """
    shared: dict[tuple[int, int], Segment] = {}
    requests: list[RequestSpec] = []
    append = requests.append
    columns = zip(
        arrivals_s.tolist(), prompt_tokens.tolist(), output_tokens.tolist(),
        prefix_groups.tolist(), prefix_tokens.tolist(), strict=True,
    )
    for request_id, (arrival_s, prompt, output, group, prefix) in enumerate(columns):
        segments: tuple[Segment, ...]
        if prefix > 0:
            head = shared.get((group, prefix))
            if head is None:
                head = _new_segment(prefix_content_id(group), prefix)
                shared[(group, prefix)] = head
            if prompt > prefix:
                segments = (head, _new_segment(UNIQUE_CONTENT_BASE + request_id, prompt - prefix))
            else:
                segments = (head,)
        else:
            group = -1
            segments = (_new_segment(UNIQUE_CONTENT_BASE + request_id, prompt),)
        append(_new_request_spec(request_id, arrival_s, prompt, output, segments, group))
    return tuple(requests)
