"""Bucket planning and flat buffers: pure functions, no process group."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from strategies.buckets import MIB, BucketLayout, GradBucket, build_buckets, plan_buckets, plan_buckets_in_order, \
    trainable_parameters

KIB_FLOATS = 256  # float32 elements in one KiB
KIB_AS_MB = 1024 / MIB


def _kib_params(*kib: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> list[torch.Tensor]:
    return [torch.zeros(n * KIB_FLOATS, dtype=dtype, device=device) for n in kib]


def test_reverse_registration_order_in_one_bucket_by_default() -> None:
    params = _kib_params(1, 1, 1)
    assert plan_buckets(params) == [[2, 1, 0]]


def test_first_bucket_has_its_own_cap_and_a_full_bucket_still_fits() -> None:
    params = _kib_params(1, 1, 1, 1, 1)
    plan = plan_buckets(params, bucket_cap_mb=2 * KIB_AS_MB, first_bucket_cap_mb=1 * KIB_AS_MB)
    # 1 KiB fills the first bucket; later buckets take exactly 2 KiB (== cap is not "exceeding").
    assert plan == [[4], [3, 2], [1, 0]]


def test_oversized_parameter_gets_its_own_bucket() -> None:
    params = _kib_params(1, 10, 1)
    plan = plan_buckets(params, bucket_cap_mb=2 * KIB_AS_MB, first_bucket_cap_mb=2 * KIB_AS_MB)
    assert plan == [[2], [1], [0]]


def test_first_cap_never_exceeds_the_general_cap() -> None:
    params = _kib_params(1, 1, 1)
    plan = plan_buckets(params, bucket_cap_mb=1 * KIB_AS_MB, first_bucket_cap_mb=1.0)
    assert plan == [[2], [1], [0]]


def test_buckets_are_homogeneous_in_device_and_dtype() -> None:
    params = [*_kib_params(1, 1), *_kib_params(1, dtype=torch.float64), *_kib_params(1, 1, device="meta")]
    plan = plan_buckets(params)
    assert plan == [[4, 3], [2], [1, 0]]  # ordered by each bucket's first (readiest) parameter
    for bucket in plan:
        assert len({(params[i].device, params[i].dtype) for i in bucket}) == 1


def test_each_group_starts_with_the_first_cap() -> None:
    params = [*_kib_params(1, 1, dtype=torch.float64), *_kib_params(1, 1)]
    plan = plan_buckets(params, bucket_cap_mb=4 * KIB_AS_MB, first_bucket_cap_mb=1 * KIB_AS_MB)
    assert plan == [[3], [2], [1], [0]]


def test_plan_from_explicit_order() -> None:
    params = _kib_params(1, 1, 1, 1)
    plan = plan_buckets_in_order(params, [1, 3, 0, 2], bucket_cap_mb=2 * KIB_AS_MB,
                                 first_bucket_cap_mb=1 * KIB_AS_MB)
    assert plan == [[1], [3, 0], [2]]


@pytest.mark.parametrize("order", [[0, 1], [0, 1, 1], [0, 1, 5]])
def test_order_must_be_a_permutation(order: list[int]) -> None:
    with pytest.raises(ValueError, match="exactly once"):
        plan_buckets_in_order(_kib_params(1, 1, 1), order)


@pytest.mark.parametrize("caps", [{"bucket_cap_mb": 0}, {"first_bucket_cap_mb": -1.0}])
def test_caps_must_be_positive(caps: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(_kib_params(1), **caps)


def test_trainable_parameters_skip_frozen_and_count_shared_once() -> None:
    shared = nn.Linear(2, 2)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    model = nn.Sequential(shared, frozen, shared)
    assert trainable_parameters(model) == [shared.weight, shared.bias]


def test_bucket_views_alias_one_flat_buffer() -> None:
    weight, bias = torch.zeros(3, 2), torch.zeros(3)
    bucket = GradBucket(7, [weight, bias])
    assert bucket.index == 7 and bucket.buffer().shape == (9,) and bucket.nbytes == 36
    assert bucket.view_for(weight).shape == (3, 2) and bucket.view_for(bias).shape == (3,)
    bucket.view_for(bias).fill_(1.0)
    bucket.view_for(weight)[0, 1] = 2.0
    assert bucket.buffer().tolist() == [0, 2, 0, 0, 0, 0, 1, 1, 1]
    bucket.buffer().mul_(3)
    assert bucket.view_for(bias).tolist() == [3, 3, 3]
    with pytest.raises(KeyError, match="not in bucket 7"):
        bucket.view_for(torch.zeros(3))


def test_the_buffers_stand_for_the_gradients_only_when_these_are_exactly_the_slots() -> None:
    params = _kib_params(1, 2, 1)
    layout = BucketLayout(params, [[2, 1], [0]])
    slots = list(layout.views)
    buffers = layout.buffers_holding(list(reversed(slots)))  # any order
    assert buffers is not None and [b.data_ptr() for b in buffers] == [b.buffer().data_ptr() for b in layout.buckets]
    assert layout.buffers_holding(slots[:2]) is None  # a subset: the buffers hold more than asked about
    assert layout.buffers_holding([slots[0], slots[0], slots[2]]) is None  # one twice, one missing
    assert layout.buffers_holding([slots[0], slots[1].clone(), slots[2]]) is None  # a .grad replaced by a copy


def test_bucket_rejects_mixed_or_empty_parameters() -> None:
    with pytest.raises(ValueError, match="mixes"):
        GradBucket(0, [torch.zeros(2), torch.zeros(2, dtype=torch.float64)])
    with pytest.raises(ValueError, match="no parameters"):
        GradBucket(0, [])


def test_build_buckets_follows_the_plan() -> None:
    params = _kib_params(1, 2, 1)
    buckets = build_buckets(params, [[2, 1], [0]])
    assert [b.index for b in buckets] == [0, 1]
    assert buckets[0].parameters[0] is params[2] and buckets[0].buffer().numel() == 3 * KIB_FLOATS
