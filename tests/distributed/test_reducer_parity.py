"""GradReducer against two references on real gloo ranks.

Each step, our reducer's `.grad` and parameters must match (a) a hand-written
`torch.nn.parallel.DistributedDataParallel` loop on the same shards and (b) one process
trained on the whole global batch; and they must be bit-for-bit identical on every rank.
Several configurations share one spawned run, since process start-up dominates the cost.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from strategies.reducer import GradReducer
from tests.helpers.reducer_models import MODELS, TinyNet, flat_params, global_batch, grads_or_zeros, \
    identical_across_ranks, max_abs_diff, reduced_backward, shard
from tests.helpers.spawn import run_on_ranks

STEPS = 3
TOL = 1e-5  # against one process on the global batch (another summation order); against torch DDP: exact
TINY_MB = 0.0001  # about 100 bytes: one bucket per parameter of these tiny models


@dataclass(frozen=True)
class Case:
    name: str
    reducer: dict[str, Any] = field(default_factory=dict)
    optimizer: str = "sgd"
    model: str = "tiny"
    micro_batches: int = 1
    autocast: bool = False
    set_to_none: bool = True
    extra_used_by_rank: tuple[bool, ...] = (True, True)  # ExtraParamNet: does rank r use `extra`?
    silent_rank: int | None = None  # this rank's loss touches no parameter (no hook fires)
    ddp_hook: str | None = None  # torch's own compression hook for the DDP reference
    global_tol: float = TOL


def _make_optimizer(name: str, module: nn.Module) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(module.parameters(), lr=0.01)
    return torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)


def _loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor, case: Case, rank: int) -> torch.Tensor:
    if rank == case.silent_rank:
        return torch.zeros((), requires_grad=True)  # backward reaches no parameter at all
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if case.autocast else contextlib.nullcontext()
    with autocast:
        out = module(x, case.extra_used_by_rank[rank])
    return nn.functional.mse_loss(out.float(), y)


def _global_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor, case: Case, world_size: int) -> torch.Tensor:
    """One process on the global batch; per-shard only where the model differs per rank."""
    rank_dependent = case.silent_rank is not None or len(set(case.extra_used_by_rank)) > 1
    if not rank_dependent:
        return _loss(module, x, y, case, 0)
    return sum(_loss(module, shard(x, r, world_size), shard(y, r, world_size), case, r)
               for r in range(world_size)) / world_size


def _torch_bf16_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
    """torch's own bf16 hook; the wrapper skips DDP's name check that demands NCCL (gloo does bf16 on CPU)."""
    return default_hooks.bf16_compress_hook(state, bucket)


_DDP_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": _torch_bf16_hook}


def _ddp_reference(module: nn.Module, case: Case) -> DistributedDataParallel:
    ddp = DistributedDataParallel(module, find_unused_parameters=case.model == "extra",
                                  bucket_cap_mb=case.reducer.get("bucket_cap_mb", 25.0))
    if case.ddp_hook is not None:
        ddp.register_comm_hook(None, _DDP_HOOKS[case.ddp_hook])
    return ddp


def _one_step(step: int, rank: int, world_size: int, case: Case, ours: nn.Module, reducer: GradReducer,
              ddp: DistributedDataParallel, reference: nn.Module) -> None:
    for micro in range(case.micro_batches):
        x, y = global_batch(step * case.micro_batches + micro)
        xs, ys = shard(x, rank, world_size), shard(y, rank, world_size)
        last = micro == case.micro_batches - 1
        with contextlib.nullcontext() if last else reducer.no_sync():
            loss = _loss(ours, xs, ys, case, rank)
            reduced_backward(reducer, loss)
        with contextlib.nullcontext() if last else ddp.no_sync():
            if case.silent_rank is None:  # torch DDP cannot take a backward that reaches no parameter
                _loss(ddp, xs, ys, case, rank).backward()
        _global_loss(reference, x, y, case, world_size).backward()


def _run_case(rank: int, world_size: int, case: Case) -> dict[str, Any]:
    base = MODELS[case.model]()
    ours, ddp_model, reference = (copy.deepcopy(base) for _ in range(3))
    reducer = GradReducer(ours, **case.reducer)
    ddp = _ddp_reference(ddp_model, case)
    models = [ours, ddp_model, reference]
    optimizers = [_make_optimizer(case.optimizer, model) for model in models]
    worst = {"grad_vs_ddp": 0.0, "param_vs_ddp": 0.0, "grad_vs_global": 0.0, "param_vs_global": 0.0}
    identical = True
    for step in range(STEPS):
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=case.set_to_none)
        _one_step(step, rank, world_size, case, ours, reducer, ddp, reference)
        ours_grads = grads_or_zeros(ours)
        if case.silent_rank is None:  # torch DDP cannot take a backward that reaches no parameter
            worst["grad_vs_ddp"] = max(worst["grad_vs_ddp"], max_abs_diff(ours_grads, grads_or_zeros(ddp_model)))
        worst["grad_vs_global"] = max(worst["grad_vs_global"], max_abs_diff(ours_grads, grads_or_zeros(reference)))
        identical &= identical_across_ranks(torch.cat([g.reshape(-1) for g in ours_grads]))
        for optimizer in optimizers:
            optimizer.step()
        if case.silent_rank is None:
            worst["param_vs_ddp"] = max(worst["param_vs_ddp"], max_abs_diff(flat_params(ours), flat_params(ddp_model)))
        worst["param_vs_global"] = max(worst["param_vs_global"], max_abs_diff(flat_params(ours), flat_params(reference)))
        identical &= identical_across_ranks(flat_params(ours))
    grads_none = {name: p.grad is None for name, p in ours.named_parameters()}
    return {"worst": worst, "identical": identical, "grads_none": grads_none, "summary": reducer.summary()}


def _run_cases(rank: int, world_size: int, cases: list[Case]) -> dict[str, dict[str, Any]]:
    return {case.name: _run_case(rank, world_size, case) for case in cases}


def _check(results: list[dict[str, dict[str, Any]]], cases: list[Case]) -> None:
    for case in cases:
        for rank, per_rank in enumerate(results):
            result = per_rank[case.name]
            worst = result["worst"]
            where = f"case {case.name!r}, rank {rank}: {worst}"
            assert result["identical"], f"ranks differ bit-wise in {where}"
            assert worst["grad_vs_ddp"] == 0.0 and worst["param_vs_ddp"] == 0.0, where  # bit for bit (README)
            assert worst["grad_vs_global"] < case.global_tol and worst["param_vs_global"] < case.global_tol, where


CORE_CASES = [
    Case("default_sgd"),
    Case("default_adam", optimizer="adam"),
    Case("tiny_buckets_adam", reducer={"bucket_cap_mb": TINY_MB}, optimizer="adam"),
    Case("no_view_sgd", reducer={"gradient_as_bucket_view": False}),
    Case("no_view_tiny_buckets", reducer={"gradient_as_bucket_view": False, "bucket_cap_mb": TINY_MB}),
    Case("view_zero_in_place", set_to_none=False, reducer={"bucket_cap_mb": TINY_MB}),
    Case("accumulate_view", micro_batches=2, reducer={"bucket_cap_mb": TINY_MB}),
    Case("accumulate_no_view", micro_batches=2, optimizer="adam", reducer={"gradient_as_bucket_view": False}),
    # The default transport between CPU ranks of one host is shared memory; gloo's stays covered.
    Case("process_group_sgd", reducer={"transport": "process_group"}),
    Case("process_group_tiny_buckets_adam", reducer={"transport": "process_group", "bucket_cap_mb": TINY_MB},
         optimizer="adam"),
]


@pytest.mark.timeout(120)
def test_matches_ddp_and_global_batch() -> None:
    results = run_on_ranks(_run_cases, 2, CORE_CASES)
    _check(results, CORE_CASES)
    summary = results[0]["tiny_buckets_adam"]["summary"]
    assert summary["buckets"] == 6 and summary["rebuilt"]
    assert summary["transport"] == "shared_memory"
    assert results[0]["process_group_sgd"]["summary"]["transport"] == "process_group"


UNUSED_CASES = [
    Case("unused_no_find", model="extra"),
    Case("unused_find", model="extra", optimizer="adam", reducer={"find_unused_parameters": True}),
    Case("used_on_one_rank", model="extra", extra_used_by_rank=(True, False), reducer={"bucket_cap_mb": TINY_MB}),
    Case("used_on_one_rank_find", model="extra", extra_used_by_rank=(False, True),
         reducer={"find_unused_parameters": True, "bucket_cap_mb": TINY_MB}),
    Case("silent_rank", silent_rank=1),
    Case("silent_rank_find", silent_rank=0, reducer={"find_unused_parameters": True}),
]


@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_unused_parameters_neither_hang_nor_diverge() -> None:
    results = run_on_ranks(_run_cases, 2, UNUSED_CASES)
    _check(results, UNUSED_CASES)
    for per_rank in results:
        # Like torch DDP: a param no rank used keeps .grad None only with find_unused_parameters.
        assert per_rank["unused_find"]["grads_none"]["unused.weight"]
        assert not per_rank["unused_no_find"]["grads_none"]["unused.weight"]
        assert not per_rank["used_on_one_rank_find"]["grads_none"]["extra.weight"]


PRECISION_CASES = [
    Case("bf16_autocast", autocast=True, global_tol=5e-3),
    Case("fp16_hook", reducer={"comm_hook": "fp16"}, ddp_hook="fp16", global_tol=5e-4),
    Case("bf16_hook", reducer={"comm_hook": "bf16"}, ddp_hook="bf16", global_tol=5e-3),
    Case("bf16_hook_process_group", reducer={"comm_hook": "bf16", "transport": "process_group"}, ddp_hook="bf16",
         global_tol=5e-3),
]


@pytest.mark.timeout(120)
@pytest.mark.conformance
def test_autocast_and_compression_hooks() -> None:
    """Exact against torch DDP doing the same thing; close to the fp32 global-batch run."""
    results = run_on_ranks(_run_cases, 2, PRECISION_CASES)
    _check(results, PRECISION_CASES)
    # Compression must actually change something, or the loose tolerance tests nothing.
    assert results[0]["fp16_hook"]["worst"]["grad_vs_global"] > 0.0


def test_world_size_one_leaves_plain_gradients_unchanged() -> None:
    """No process group: the reducer must not change what plain backward computes."""
    ours, plain = TinyNet(), TinyNet()
    reducer = GradReducer(ours, bucket_cap_mb=TINY_MB)
    for step in range(2):
        x, y = global_batch(step)
        for model in (ours, plain):
            model.zero_grad()
        loss = nn.functional.mse_loss(ours(x), y)
        reduced_backward(reducer, loss)
        nn.functional.mse_loss(plain(x), y).backward()
        assert max_abs_diff(grads_or_zeros(ours), grads_or_zeros(plain)) == 0.0
    assert reducer.summary()["synced_steps"] == 2


def test_remove_leaves_standalone_grads() -> None:
    model = TinyNet()
    reducer = GradReducer(model)
    x, y = global_batch(0)
    nn.functional.mse_loss(model(x), y).backward()
    reducer.finish_backward()
    before = grads_or_zeros(model)
    reducer.remove()
    for param in model.parameters():
        assert param.grad is not None and param.grad._base is None  # no longer a bucket view
    assert max_abs_diff(before, grads_or_zeros(model)) == 0.0
    nn.functional.mse_loss(model(x), y).backward()  # no hook fires any more
    assert max_abs_diff([2 * g for g in before], grads_or_zeros(model)) < 1e-6
    with pytest.raises(RuntimeError, match="after remove"):
        reducer.finish_backward()


@pytest.mark.parametrize("kwargs, error", [
    ({"bucket_cap_mb": 0}, ValueError),
    ({"first_bucket_cap_mb": -1.0}, ValueError),
    ({"comm_hook": "fp8"}, ValueError),
    ({"comm_hook": 3}, TypeError),
    ({"transport": "tcp"}, ValueError),
])
def test_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        GradReducer(TinyNet(), **kwargs)


def test_rejects_a_non_module() -> None:
    with pytest.raises(TypeError, match="nn.Module"):
        GradReducer("not a module")  # type: ignore[arg-type]


def test_gradient_after_its_bucket_was_sent_is_an_error_not_a_silent_drop() -> None:
    """find_unused_parameters trusts the outputs it is given; a wrong one must fail loudly."""
    model = TinyNet()
    reducer = GradReducer(model, find_unused_parameters=True)
    x, y = global_batch(0)
    loss = nn.functional.mse_loss(model(x), y)
    reducer.prepare_for_backward(loss.detach())  # reaches no parameter: every bucket is sent now
    with pytest.raises(RuntimeError, match="pass every output the loss depends on"):
        loss.backward()


class _CheckpointedNet(nn.Module):
    """A reentrant checkpoint hides its parameters from the graph walk of `find_unused_parameters`: they are
    marked unused up front and then get their gradients during backward after all."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.utils.checkpoint.checkpoint(lambda t: torch.tanh(self.b(t)), torch.tanh(self.a(x)),
                                                   use_reentrant=True)
        return self.c(hidden)


def _used_after_all(rank: int, world_size: int, as_view: bool, set_to_none: bool) -> float:
    """Largest gap to the plain average of local gradients, over 3 steps of 2 micro-batches (no_sync first)."""
    import torch.distributed as dist

    net, reference = _CheckpointedNet(), _CheckpointedNet()
    reducer = GradReducer(net, process_group=dist.group.WORLD, gradient_as_bucket_view=as_view,
                          find_unused_parameters=True)
    generator, worst = torch.Generator().manual_seed(rank), 0.0
    for _ in range(3):
        net.zero_grad(set_to_none=set_to_none)
        reference.zero_grad()
        for micro_batch in range(2):
            x = torch.randn(2, 4, generator=generator)
            loss = net(x).pow(2).sum()
            reference(x).pow(2).sum().backward()
            with reducer.no_sync() if micro_batch == 0 else contextlib.nullcontext():
                reduced_backward(reducer, loss)
        for param in reference.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        worst = max([worst, *(float((p.grad - q.grad).abs().max()) for p, q in zip(net.parameters(),
                                                                                   reference.parameters()))])
        with torch.no_grad():
            for p, q in zip(net.parameters(), reference.parameters()):
                p.sub_(0.1 * p.grad)
                q.sub_(0.1 * q.grad)
    return worst


@pytest.mark.timeout(120)
@pytest.mark.parametrize("as_view, set_to_none", [(True, True), (True, False), (False, True)])
@pytest.mark.conformance
def test_parameters_marked_unused_but_used_after_all_average_exactly(as_view: bool, set_to_none: bool) -> None:
    """Their gradient (accumulated over no_sync, then this pass) is divided once and lands whole in the average."""
    assert run_on_ranks(_used_after_all, 2, as_view, set_to_none) == [0.0, 0.0]
