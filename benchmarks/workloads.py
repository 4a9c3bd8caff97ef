"""The benchmark workloads: plain `nn.Module`s, a loss, and data made in-process.

Every contender builds the model from the same seed and draws the same synthetic batches, so
the only thing that differs between contenders is how gradients are synchronised and how much
framework sits around the loop. Sizes are chosen for a 2-core CPU with gloo (2 ranks x 1 thread):

* ``mlp``  comm-bound: ~8.4M parameters (32 MiB of fp32 gradients), small batch.
* ``gpt``  balanced: a ~4.9M-parameter GPT, sequence 128.
* ``cnn``  compute-bound: a ~0.51M-parameter CNN on 3x32x32 images.
* ``gpt_host``  host-bound: ``gpt``'s graph (the same 77 parameter tensors, layers and kernels) at width
  32 and sequence 16, so its arithmetic costs almost nothing and a step's time is the host's work around
  the kernels: the regime of a compiled model on a fast GPU, which the CPU can otherwise not show. Not in
  the default run (`--workloads gpt_host`; one rank, `--devices 1`, isolates the framework's own work).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

SEED = 1234


@dataclass(frozen=True)
class Workload:
    """What a contender needs: a model factory, a per-rank batch size and a dataset factory."""

    name: str
    kind: str  # "comm-bound" | "balanced" | "compute-bound"
    batch_size: int  # per rank
    build_model: Callable[[], nn.Module]
    make_inputs: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    optimizer: str = "sgd"  # "sgd" (momentum 0.9) | "adamw"
    lr: float = 1e-2

    def model(self) -> nn.Module:
        torch.manual_seed(SEED)
        return self.build_model()

    def dataset(self, samples: int) -> torch.utils.data.TensorDataset:
        generator = torch.Generator().manual_seed(SEED)
        return torch.utils.data.TensorDataset(*self.make_inputs(samples, generator))


class OptimizerChoice(Protocol):
    """What picks a workload's optimizer (this module's `Workload`, the GPU benchmark's too)."""

    @property
    def optimizer(self) -> str: ...

    @property
    def lr(self) -> float: ...


def make_optimizer(workload: OptimizerChoice, model: nn.Module) -> torch.optim.Optimizer:
    if workload.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=workload.lr)
    return torch.optim.SGD(model.parameters(), lr=workload.lr, momentum=0.9)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross entropy for every workload (the GPT flattens its tokens)."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class BenchSteps:
    """The body of every framework contender's LightningModule; mixed in before the framework's
    own LightningModule (ours or pytorch_lightning's), which the two `BenchModule`s add."""

    def __init__(self, work: Workload) -> None:
        super().__init__()
        self.work = work
        self.model = work.model()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return loss_fn(self.model, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.work, self.model)


# ---------------------------------------------------------------------- comm-bound: MLP
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10))


def _mlp_inputs(samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(samples, 1024, generator=generator), torch.randint(0, 10, (samples,), generator=generator)


# ---------------------------------------------------------------------- balanced: GPT
class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = (t.view(batch, time, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(width, dim=2))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, width))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """nanoGPT-shaped: token + position embeddings, pre-LN blocks, untied head."""

    def __init__(self, vocab: int = 256, block: int = 128, width: int = 256, layers: int = 6, heads: int = 4):
        super().__init__()
        self.token, self.position = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.blocks = nn.Sequential(*(_Block(width, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.head(self.ln(self.blocks(self.token(tokens) + self.position(positions))))


def _gpt_inputs(samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 256, (samples, 129), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _host_bound_gpt() -> nn.Module:
    return TinyGPT(vocab=64, block=16, width=32, layers=6, heads=2)


def _host_bound_gpt_inputs(samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 64, (samples, 17), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# ---------------------------------------------------------------------- compute-bound: CNN
def _cnn() -> nn.Module:
    def stage(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]

    return nn.Sequential(*stage(3, 32), *stage(32, 64), *stage(64, 192), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(192, 10))


def _cnn_inputs(samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(samples, 3, 32, 32, generator=generator),
            torch.randint(0, 10, (samples,), generator=generator))


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload("mlp", "comm-bound", 32, _mlp, _mlp_inputs),
    "gpt": Workload("gpt", "balanced", 2, TinyGPT, _gpt_inputs, optimizer="adamw", lr=3e-4),
    "cnn": Workload("cnn", "compute-bound", 32, _cnn, _cnn_inputs),
    "gpt_host": Workload("gpt_host", "host-bound", 2, _host_bound_gpt, _host_bound_gpt_inputs, optimizer="adamw",
                         lr=3e-4),
}
DEFAULT_WORKLOADS = ("mlp", "gpt", "cnn")
