"""`new_request_record` builds the same frozen `RequestRecord` as its keyword constructor."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from sim.engine.records import RequestRecord, new_request_record


def test_new_request_record_is_a_request_record() -> None:
    fields = dict(request_id=7, replica=2, arrival_s=1.5, first_scheduled_s=1.75, first_token_s=2.0, finish_s=9.25,
                  prompt_tokens=512, output_tokens=64, prefix_hit_tokens=256, num_preemptions=1, recomputed_tokens=80)
    made = RequestRecord(**fields)
    fast = new_request_record(*fields.values())
    assert type(fast) is RequestRecord
    assert fast == made and hash(fast) == hash(made) and repr(fast) == repr(made)
    assert dataclasses.asdict(fast) == fields
    assert pickle.loads(pickle.dumps(fast)) == made
    assert fast.tpot_s() == made.tpot_s()
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.finish_s = 0.0  # type: ignore[misc]
