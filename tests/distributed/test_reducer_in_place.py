"""Between CPU ranks of one host the built-in hooks average each gradient where autograd left it (#37).

The shared-memory transport copies a bucket into its slots anyway; copying every gradient into the bucket
first was a second pass over all of them, on the thread that runs backward. Checked on real ranks against
torch DDP: the same bits, the `.grad` tensors autograd made are the ones that hold the means (no copy), and
the cases that cannot be read in place (a channels-last gradient, the process group, a custom hook) are
still copied and still exact.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from strategies.reducer import GradReducer
from tests.helpers.reducer_models import max_abs_diff, reduced_backward
from tests.helpers.spawn import run_on_ranks

pytestmark = pytest.mark.timeout(120)


class ConvNet(nn.Module):
    """A conv layer (channels-last in one case: its weight's gradient is not contiguous) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


def _custom_mean(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer().div_(state.world_size)
    return state.all_reduce_async(buffer).then(lambda fut: fut.value()[0])


def _one_case(rank: int, world_size: int, reducer_options: dict[str, Any], channels_last: bool) -> dict[str, Any]:
    ours, reference = ConvNet(), ConvNet()
    if channels_last:
        ours, reference = ours.to(memory_format=torch.channels_last), reference.to(memory_format=torch.channels_last)
    made_by_autograd: dict[str, int] = {}
    contiguous_from_autograd: dict[str, bool] = {}

    def saw(param: torch.Tensor, name: str) -> None:
        made_by_autograd[name], contiguous_from_autograd[name] = param.grad.data_ptr(), param.grad.is_contiguous()

    for name, param in ours.named_parameters():  # registered first, so it sees the gradient before the reducer
        param.register_post_accumulate_grad_hook(lambda p, name=name: saw(p, name))
    reducer = GradReducer(ours, **reducer_options)
    ddp = DistributedDataParallel(reference)
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) for model in (ours, ddp)]
    kept, worst = True, 0.0
    for step in range(3):
        generator = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(4, 3, 6, 6, generator=generator), torch.randn(4, 5, generator=generator)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = nn.functional.mse_loss(ours(x), y)
        reduced_backward(reducer, loss)
        nn.functional.mse_loss(ddp(x), y).backward()
        worst = max(worst, max_abs_diff([p.grad for p in ours.parameters()], [p.grad for p in ddp.parameters()]))
        kept &= all(param.grad.data_ptr() == made_by_autograd[name] for name, param in ours.named_parameters())
        for optimizer in optimizers:
            optimizer.step()
    summary = reducer.summary()
    reducer.remove()
    dist.barrier()
    return {"worst": worst, "kept": kept, "transport": summary["transport"],
            "conv_weight_contiguous": contiguous_from_autograd["conv.weight"]}


def _cases(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    return {
        "default": _one_case(rank, world_size, {}, channels_last=False),
        "no_view": _one_case(rank, world_size, {"gradient_as_bucket_view": False}, channels_last=False),
        "channels_last": _one_case(rank, world_size, {}, channels_last=True),
        "process_group": _one_case(rank, world_size, {"transport": "process_group"}, channels_last=False),
        "custom_hook": _one_case(rank, world_size, {"comm_hook": _custom_mean}, channels_last=False),
    }


def test_gradients_are_averaged_where_autograd_left_them() -> None:
    for rank, cases in enumerate(run_on_ranks(_cases, 2)):
        for name, result in cases.items():
            assert result["worst"] == 0.0, (rank, name, result)  # torch DDP's bits, copied or not
        assert cases["default"]["transport"] == "shared_memory"
        assert cases["default"]["kept"] and cases["no_view"]["kept"], cases  # the means are in autograd's tensors
        # Copied into the bucket (and, as a view, left there): not readable in place, or not our transport's hook.
        assert not cases["channels_last"]["conv_weight_contiguous"]
        assert not cases["channels_last"]["kept"]
        assert not cases["process_group"]["kept"] and not cases["custom_hook"]["kept"]
