"""DistributedSampler injection on real ranks: disjoint, equal-length shards that reshuffle per epoch."""

from __future__ import annotations

import pytest

from tests.helpers.ddp_workers import shard_indices
from tests.helpers.spawn import run_on_ranks

SIZE = 11  # odd on purpose: the sampler must pad so both ranks get the same number of batches


@pytest.mark.timeout(90)
def test_shards_are_disjoint_equal_and_reshuffled_each_epoch() -> None:
    rank0, rank1 = run_on_ranks(shard_indices, 2, SIZE)
    for key in ("epoch0", "epoch1", "sequential"):
        assert len(rank0[key]) == len(rank1[key]) == 6, key  # ceil(11 / 2)
        assert set(rank0[key]) | set(rank1[key]) == set(range(SIZE)), key  # nothing lost
        overlap = set(rank0[key]) & set(rank1[key])
        assert len(overlap) <= 1, key  # only the one padded sample may repeat
    assert rank0["batches"] == rank1["batches"] == 3
    for rank in (rank0, rank1):
        assert rank["epoch0"] == rank["epoch0_again"]  # set_epoch is deterministic ...
        assert rank["epoch0"] != rank["epoch1"]  # ... and a new epoch reshuffles
    assert rank0["sequential"] == [0, 2, 4, 6, 8, 10] and rank1["sequential"] == [1, 3, 5, 7, 9, 0]
