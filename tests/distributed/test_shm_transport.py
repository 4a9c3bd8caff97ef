"""The same-host shared-memory all-reduce against gloo's, on real ranks.

It must give gloo's sums (bit-exact with two ranks, where a + b has one order), bit-identical
values on every rank, in any dtype and for tensors larger than one slot; clean up its file;
fall back to the process group when it cannot serve every rank ("auto"), or say why
("shared_memory"); and turn a peer that never arrives into an error naming that peer.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import strategies.shm_region as shm_region
import strategies.shm_transport as shm
from tests.helpers.reducer_models import identical_across_ranks
from tests.helpers.spawn import RankFailed, run_on_ranks

pytestmark = pytest.mark.timeout(120)

SLOT = 4096  # bytes: small, so the larger tensors take several rounds
SIZES = [1, 17, 1023, 1024, 1025, 5000]  # fp32 1024 = exactly one slot; 5000 = five rounds
DTYPES = [torch.float32, torch.bfloat16, torch.float64]
WIRE_DTYPES = [torch.bfloat16, torch.float16]  # fp32 tensors sent compressed (the bf16/fp16 comm hooks)


def _contribution(rank: int, numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(numel, generator=generator).to(dtype)


def _compare_with_gloo(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    os.environ[shm_region.SHM_DIR_ENV] = directory
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=30),
                                          slot_bytes=SLOT)
    assert transport is not None
    files_after_setup = os.listdir(directory)
    cases = [(numel, dtype, None) for numel in SIZES for dtype in DTYPES]
    cases += [(numel, torch.float32, wire) for numel in SIZES for wire in WIRE_DTYPES]
    ours = [_contribution(rank, numel, dtype, seed) for seed, (numel, dtype, _) in enumerate(cases)]
    # All queued before any wait, as the reducer does with its buckets.
    futures = [transport.all_reduce_async(tensor, wire) for tensor, (_, _, wire) in zip(ours, cases)]
    for future, tensor in zip(futures, ours):
        assert future.wait()[0] is tensor
    worst, identical = 0.0, True
    for seed, ((numel, dtype, wire), tensor) in enumerate(zip(cases, ours)):
        expected = _contribution(rank, numel, dtype, seed).to(wire or dtype)  # gloo sums in the wire dtype
        dist.all_reduce(expected)
        worst = max(worst, (tensor.double() - expected.double()).abs().max().item())
        identical &= identical_across_ranks(tensor.double())
    transport.close()
    return {"worst": worst, "identical": identical, "files_after_setup": files_after_setup}


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.conformance)])
def test_sums_like_gloo_in_every_dtype_and_size(world_size: int, tmp_path: Path) -> None:
    results = run_on_ranks(_compare_with_gloo, world_size, str(tmp_path))
    for rank, result in enumerate(results):
        assert result["identical"], f"rank {rank} differs from its peers"
        if rank == 0:  # rank 0 unlinks it before returning; the others may look a moment earlier
            assert result["files_after_setup"] == [], "the region file must be unlinked once every rank mapped it"
        if world_size == 2:  # one addition per element: the same order as gloo's, so the same bits
            assert result["worst"] == 0.0, result
        else:  # three addends in another order (and compressed sums rounded once, not twice): bf16 rounding
            assert result["worst"] < 0.05, result
    assert list(tmp_path.iterdir()) == []


def _reduce_scatter_against_all_reduce(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    """ZeRO's reduce-scatter: this rank's chunk of the sum, into a separate output or in place, against the
    shared-memory all-reduce's chunk (the same bits at any world size) and gloo's reduce_scatter_single."""
    os.environ[shm_region.SHM_DIR_ENV] = directory
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=30),
                                          slot_bytes=SLOT)
    assert transport is not None
    cases = [(world_size * chunk, dtype) for chunk in (1, 17, 1024, 3000) for dtype in (torch.float32, torch.bfloat16)]
    inputs = [_contribution(rank, numel, dtype, seed) for seed, (numel, dtype) in enumerate(cases)]
    outputs = [torch.full((numel // world_size,), float("nan"), dtype=dtype) for numel, dtype in cases]
    in_place = [tensor.clone() for tensor in inputs]
    futures = [transport.reduce_scatter_async(tensor, out) for tensor, out in zip(inputs, outputs)]
    futures += [transport.reduce_scatter_async(tensor, tensor.view(world_size, -1)[rank]) for tensor in in_place]
    for future in futures:
        future.wait()
    exact_as_all_reduce, worst_against_gloo = True, 0.0
    for tensor, out, same_buffer in zip(inputs, outputs, in_place):
        chunk = out.numel()
        summed = tensor.clone()
        transport.all_reduce_async(summed).wait()
        mine = summed[rank * chunk:(rank + 1) * chunk]
        exact_as_all_reduce &= torch.equal(out, mine)
        exact_as_all_reduce &= torch.equal(same_buffer[rank * chunk:(rank + 1) * chunk], mine)
        exact_as_all_reduce &= torch.equal(same_buffer[:rank * chunk], tensor[:rank * chunk])  # the rest: untouched
        expected = torch.empty_like(out)
        dist.reduce_scatter_single(expected, tensor.clone())
        worst_against_gloo = max(worst_against_gloo, (out.double() - expected.double()).abs().max().item())
    transport.close()
    return {"exact_as_all_reduce": exact_as_all_reduce, "worst_against_gloo": worst_against_gloo}


@pytest.mark.conformance  # ~12 s each on the 2-core machine; every ZeRO fit runs it too (transport "auto")
@pytest.mark.parametrize("world_size", [2, 3])
def test_reduce_scatter_gives_each_rank_its_chunk_of_the_all_reduce(world_size: int, tmp_path: Path) -> None:
    for result in run_on_ranks(_reduce_scatter_against_all_reduce, world_size, str(tmp_path)):
        assert result["exact_as_all_reduce"], result
        limit = 0.0 if world_size == 2 else 0.05  # gloo adds three addends in its own order (bf16 rounding)
        assert result["worst_against_gloo"] <= limit, result


def _scattered_against_one_tensor(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    """A bucket's gradients where autograd left them: a list of tensors reduced as one run, divided on the way
    in, against the same values concatenated, divided first and reduced as one tensor (the copying path), and
    against gloo's sum of the divided values."""
    os.environ[shm_region.SHM_DIR_ENV] = directory
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=30),
                                          slot_bytes=SLOT)
    assert transport is not None
    # Pieces that end inside a round, span several rounds, and straddle the chunk boundary of each rank.
    shapes = [(1,), (17, 3), (1023,), (2, 1500), (5,), (4000,)]
    exact_as_one_tensor, exact_as_gloo = True, True
    for seed, wire in enumerate((None, torch.bfloat16)):
        pieces = [_contribution(rank, int(torch.tensor(shape).prod()), torch.float32, 10 * seed + i).view(shape)
                  for i, shape in enumerate(shapes)]
        flat = torch.cat([piece.reshape(-1) for piece in pieces]) / world_size
        expected = flat.to(wire) if wire is not None else flat.clone()
        results = transport.all_reduce_async(pieces, wire, divisor=world_size).wait()
        assert [result is piece for result, piece in zip(results, pieces)] == [True] * len(pieces)
        transport.all_reduce_async(flat, wire).wait()
        ours = torch.cat([piece.reshape(-1) for piece in pieces])
        exact_as_one_tensor &= torch.equal(ours, flat)
        dist.all_reduce(expected)  # gloo sums in the wire dtype
        exact_as_gloo &= torch.equal(ours, expected.float())
    transport.close()
    return {"exact_as_one_tensor": exact_as_one_tensor, "exact_as_gloo": exact_as_gloo}


def test_a_list_of_tensors_is_reduced_as_one_run_divided_on_the_way(tmp_path: Path) -> None:
    for result in run_on_ranks(_scattered_against_one_tensor, 2, str(tmp_path)):
        assert result == {"exact_as_one_tensor": True, "exact_as_gloo": True}


def _special_contribution(rank: int, numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values over the whole range, with subnormals, infinities and NaNs: where a fused divide-and-add could
    round otherwise."""
    values = _contribution(rank, numel, dtype, seed) * torch.exp(4 * _contribution(rank + 7, numel, dtype, seed))
    tiny = torch.finfo(dtype).tiny
    values[::11] *= tiny  # subnormal after the division
    values[5::97] = float("inf") if rank % 2 else float("nan")
    values[3::101] = -float("nan") if rank == 0 else float("nan")  # two NaNs of other signs meet in one sum
    values[7::89] = torch.finfo(dtype).max
    return values


def _my_share_read_in_place(rank: int, world_size: int, directory: str) -> dict[str, bool]:
    """Each rank's own chunk is summed straight from its tensors (divided on the way) rather than from its slot:
    the means must be those of dividing every rank's values and adding them in rank order, on every rank, for
    one tensor and for a list whose pieces straddle the rounds and the ranks' chunks."""
    os.environ[shm_region.SHM_DIR_ENV] = directory
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=30),
                                          slot_bytes=SLOT)
    assert transport is not None
    exact = {}
    for dtype in (torch.float32, torch.float64):
        for shapes in ([(5000,)], [(1,), (17, 3), (1023,), (2, 1500), (5,), (4000,)]):
            seeds = range(len(shapes))
            pieces = [_special_contribution(rank, int(torch.tensor(shape).prod()), dtype, seed).view(shape)
                      for seed, shape in zip(seeds, shapes)]
            transport.all_reduce_async(pieces, divisor=world_size).wait()
            expected = None
            for peer in range(world_size):  # the definition: each rank's values divided, summed in rank order
                share = torch.cat([_special_contribution(peer, int(torch.tensor(shape).prod()), dtype, seed)
                                   for seed, shape in zip(seeds, shapes)]) / world_size
                expected = share if expected is None else expected + share
            assert expected is not None
            ours = torch.cat([piece.reshape(-1) for piece in pieces])
            bits = torch.int32 if dtype == torch.float32 else torch.int64
            nan = expected.isnan()  # which NaN two NaNs add to is the order's, not the values' (see the docstring)
            exact[f"{dtype}, {len(shapes)} tensors"] = (torch.equal(ours.isnan(), nan) and bool(nan.any())
                                                       and torch.equal(ours[~nan].view(bits), expected[~nan].view(bits)))
            exact[f"{dtype}, {len(shapes)} tensors, identical"] = identical_across_ranks(ours.view(bits))
    transport.close()
    return exact


@pytest.mark.parametrize("world_size", [2, 3, pytest.param(4, marks=pytest.mark.conformance)])
def test_my_own_share_is_summed_from_the_tensors_with_the_bits_of_divide_then_add(world_size: int,
                                                                                   tmp_path: Path) -> None:
    for rank, result in enumerate(run_on_ranks(_my_share_read_in_place, world_size, str(tmp_path))):
        assert all(result.values()), f"rank {rank}: {result}"


def _count_nonfinite(rank: int, world_size: int, directory: str) -> list[int]:
    """The count of non-finite shares after each of five reductions, as this rank reads it."""
    os.environ[shm_region.SHM_DIR_ENV] = directory
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=30),
                                          slot_bytes=SLOT)
    assert transport is not None
    counts = []

    def reduce(values: torch.Tensor, check: bool = True) -> None:
        transport.all_reduce_async([values[:700], values[700:]], divisor=world_size, check_finite=check).wait()
        counts.append(transport.nonfinite_rounds())

    finite = _contribution(rank, 3000, torch.float32, 0)  # three rounds
    reduce(finite.clone())
    nan_on_rank_1 = finite.clone()
    if rank == 1:
        nan_on_rank_1[2500] = float("nan")  # in the third round, in rank 1's addend only
    reduce(nan_on_rank_1)
    reduce(nan_on_rank_1.clone(), check=False)  # not asked: not counted
    huge = torch.full((3000,), 3e38)  # each mean is finite; a plain sum of a share overflows
    reduce(huge)
    reduce(huge * 4)  # 3e38 * 4 is inf on every rank
    transport.close()
    return counts


def test_ranks_count_the_same_nonfinite_rounds(tmp_path: Path) -> None:
    counts = run_on_ranks(_count_nonfinite, 2, str(tmp_path))
    # The last reduction: 3 rounds x 2 ranks' shares, all infinite. Only "did it grow" matters to the reducer.
    assert counts[0] == counts[1] == [0, 1, 1, 1, 7], counts


def _connect(rank: int, world_size: int, transport: str, directory: str, split_hosts: bool) -> str | None:
    os.environ[shm_region.SHM_DIR_ENV] = directory
    if split_hosts:
        shm.host_identity = lambda: f"host-{rank}"  # type: ignore[assignment]  # as on two machines
    connected = shm.connect_shared_memory(None, transport=transport, timeout=timedelta(seconds=30))
    if connected is None:
        return None
    connected.close()
    return "shared_memory"


@pytest.mark.parametrize("split_hosts", [False, True], ids=["no-shm-dir", "two-hosts"])
@pytest.mark.conformance
def test_auto_falls_back_to_the_process_group_on_every_rank(split_hosts: bool, tmp_path: Path) -> None:
    directory = str(tmp_path) if split_hosts else str(tmp_path / "missing")
    assert run_on_ranks(_connect, 2, "auto", directory, split_hosts) == [None, None]
    assert run_on_ranks(_connect, 2, "auto", str(tmp_path), False) == ["shared_memory", "shared_memory"]


@pytest.mark.conformance
def test_shared_memory_that_cannot_be_had_is_an_error_naming_why(tmp_path: Path) -> None:
    with pytest.raises(RankFailed, match=r"unavailable: rank 0: .*missing does not exist.*transport='auto'"):
        run_on_ranks(_connect, 2, "shared_memory", str(tmp_path / "missing"), False)
    with pytest.raises(RankFailed, match="unavailable: the ranks run on 2 hosts"):
        run_on_ranks(_connect, 2, "shared_memory", str(tmp_path), True)


def _one_rank_never_arrives(rank: int, world_size: int, directory: str) -> str:
    os.environ[shm_region.SHM_DIR_ENV] = directory
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=2))
    assert transport is not None
    message = "arrived"
    if rank == 0:
        future = transport.all_reduce_async(torch.ones(10))
        try:
            future.wait()
        except Exception as error:  # noqa: BLE001 - the message is what the test checks
            message = str(error)
        later = transport.all_reduce_async(torch.ones(10))  # a broken transport fails at once, no new wait
        with pytest.raises(Exception, match="waited"):
            later.wait()
    transport.close()
    return message


@pytest.mark.conformance
def test_a_peer_that_never_arrives_is_an_error_naming_it(tmp_path: Path) -> None:
    message = run_on_ranks(_one_rank_never_arrives, 2, str(tmp_path))[0]
    assert "rank 0 waited" in message and "for rank 1 to copy its gradients in" in message, message


def test_rejects_an_unknown_transport() -> None:
    with pytest.raises(ValueError, match="transport='tcp'.*'auto', 'shared_memory', 'process_group'"):
        shm.check_transport("tcp")


def _reduce_and_report(rank: int, directory: str, numel: int, fail: bool) -> str:
    """One all-reduce of `numel` ones; `fail` makes this rank's worker raise mid-round (fault injection)."""
    os.environ[shm_region.SHM_DIR_ENV] = directory
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=60))
    assert transport is not None
    if fail:
        def broken_round(*_: Any) -> None:
            raise ValueError(f"injected failure on rank {rank}")
        transport._round = broken_round  # type: ignore[method-assign]
    try:
        transport.all_reduce_async(torch.ones(numel)).wait()
    except Exception as error:  # noqa: BLE001 - the message is what the test checks
        return str(error)
    finally:
        transport.close()
    return "no error"


def _mismatched_sizes(rank: int, world_size: int, directory: str) -> str:
    return _reduce_and_report(rank, directory, numel=10 + 2 * rank, fail=False)


@pytest.mark.conformance
def test_ranks_sending_different_sizes_fail_instead_of_summing_garbage(tmp_path: Path) -> None:
    started = time.monotonic()
    messages = run_on_ranks(_mismatched_sizes, 2, str(tmp_path))
    assert "rank 0 sends 10 elements (torch.float32) but rank 1 sends 12" in messages[0], messages
    assert "rank 1 sends 12 elements (torch.float32) but rank 0 sends 10" in messages[1], messages
    assert time.monotonic() - started < 30  # at once, not after the 60 s timeout


def _one_rank_fails(rank: int, world_size: int, directory: str) -> str:
    return _reduce_and_report(rank, directory, numel=10, fail=rank == 1)


@pytest.mark.conformance
def test_a_failing_rank_stops_its_peers_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    messages = run_on_ranks(_one_rank_fails, 2, str(tmp_path))
    assert "injected failure on rank 1" in messages[1]
    assert "rank 1 failed in shared-memory all-reduce round 1" in messages[0], messages
    assert time.monotonic() - started < 30  # not after the 60 s timeout


def test_a_misaligned_slot_size_is_refused(tmp_path: Path) -> None:
    import mmap
    with pytest.raises(ValueError, match="slot_bytes=1000 must be a positive multiple of the page size"):
        shm.SharedMemoryAllReduce(mmap.mmap(-1, 8192), rank=0, world_size=1, slot_bytes=1000,
                                  timeout=timedelta(seconds=1))


def _threads_a_round_adds(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    """The process's threads before and after one large all-reduce, on a rank computing with 2 intra-op
    threads (its OpenMP team made first, as backward would), and the sum's correctness."""
    os.environ[shm_region.SHM_DIR_ENV] = directory
    torch.set_num_threads(2)
    torch.ones(1 << 20).add_(1)  # the rank's own team of 2 exists before counting
    transport = shm.connect_shared_memory(None, transport="shared_memory", timeout=timedelta(seconds=30))
    assert transport is not None
    before = len(os.listdir("/proc/self/task"))
    tensor = torch.ones(1 << 21)  # 8 MB: rounds of 2 MB slots, each copy large enough to run in parallel
    transport.all_reduce_async(tensor).wait()
    after = len(os.listdir("/proc/self/task"))
    transport.close()
    return {"before": before, "after": after, "sum": float(tensor.sum()), "main_threads": torch.get_num_threads()}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_rounds_run_on_one_thread_beside_a_multithreaded_rank(tmp_path: Path) -> None:
    """A round's copies and adds must not start a second OpenMP team beside the rank's own: with 8 intra-op
    threads per rank that doubled the threads on every core and the cnn ran at 0.43x torch DDP on 16 cores."""
    for rank, result in enumerate(run_on_ranks(_threads_a_round_adds, 2, str(tmp_path))):
        assert result["sum"] == 2.0 * (1 << 21), result
        assert result["after"] == result["before"], f"rank {rank}: a round started threads of its own: {result}"
        assert result["main_threads"] == 2, f"rank {rank}: the rank's own setting changed: {result}"
