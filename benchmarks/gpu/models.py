"""The GPU benchmark's workloads: models people train, at the sizes a GPU verdict needs.

* ``gpt2``      GPU-bound: GPT-2 small's shape (12 layers, width 768, 12 heads, sequence 1024, the
  token embedding tied to the head: ~124M parameters).
* ``resnet50``  GPU-bound: ResNet-50's shape (bottleneck stages 3-4-6-3, 224x224 images,
  channels_last), ~25.6M parameters.
* ``gpt``       launch-bound: the CPU harness's small GPT (~4.9M parameters, sequence 128), whose
  steps on a GPU cost about as much host work as kernel time.

Every contender builds the same model from the same seed and trains on the same few batches, which
sit on the device before timing starts: the benchmark times training steps, not a data pipeline.
`smoke=True` shrinks every workload to a toy of the same structure, so the CPU test suite runs the
whole command in seconds and it cannot rot between GPU sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.workloads import SEED, TinyGPT, loss_fn, make_optimizer

loss_of = loss_fn  # cross entropy for every workload (a GPT's tokens flattened into one batch)

BATCHES_ON_DEVICE = 4  # distinct batches, cycled: enough that no step reuses the previous step's input


@dataclass(frozen=True)
class GpuWorkload:
    """A model factory, its optimizer and a batch factory; `kind` names what bounds its step."""

    name: str
    kind: str
    batch_size: int
    build: Callable[[], nn.Module]
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    optimizer: str  # "adamw" | "sgd"
    lr: float
    channels_last: bool = False

    def model(self, device: torch.device) -> nn.Module:
        torch.manual_seed(SEED)
        model = self.build().to(device)
        return model.to(memory_format=torch.channels_last) if self.channels_last else model  # type: ignore[call-overload]

    def batches(self, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(SEED)
        batches = []
        for _ in range(BATCHES_ON_DEVICE):
            inputs, targets = self.make_batch(self.batch_size, generator)
            if self.channels_last:
                inputs = inputs.contiguous(memory_format=torch.channels_last)
            batches.append((inputs.to(device), targets.to(device)))
        return batches

    def optimizer_for(self, model: nn.Module) -> torch.optim.Optimizer:
        return make_optimizer(self, model)


def cycle(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from batches


# ---------------------------------------------------------------------- GPT-2 small
class TiedGPT(TinyGPT):
    """GPT-2's weight tying: the output head shares the token embedding's matrix."""

    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int) -> None:
        super().__init__(vocab=vocab, block=block, width=width, layers=layers, heads=heads)
        self.head.weight = self.token.weight


def _tokens(vocab: int, sequence: int) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]:
    def make(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, vocab, (batch, sequence + 1), generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return make


# ---------------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    """1x1 down, 3x3 (strided where the stage shrinks the image), 1x1 up to 4x width, plus the skip."""

    def __init__(self, channels_in: int, width: int, stride: int) -> None:
        super().__init__()
        channels_out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, channels_out, 1, bias=False), nn.BatchNorm2d(channels_out))
        self.skip = nn.Identity() if stride == 1 and channels_in == channels_out else nn.Sequential(
            nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False), nn.BatchNorm2d(channels_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


def resnet(widths: tuple[int, ...] = (64, 128, 256, 512), depths: tuple[int, ...] = (3, 4, 6, 3),
           classes: int = 1000) -> nn.Module:
    stem = widths[0]
    layers: list[nn.Module] = [nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(stem),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
    channels = stem
    for stage, (width, depth) in enumerate(zip(widths, depths)):
        for block in range(depth):
            layers.append(Bottleneck(channels, width, stride=2 if stage > 0 and block == 0 else 1))
            channels = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


def _images(size: int, classes: int) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]:
    def make(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(batch, 3, size, size, generator=generator),
                torch.randint(0, classes, (batch,), generator=generator))

    return make


# ---------------------------------------------------------------------- the table
def workloads(smoke: bool = False) -> dict[str, GpuWorkload]:
    """The three workloads at GPU sizes, or (smoke) as toys of the same structure for the CPU.

    The GPU-bound batches are sized so the device, not the host, sets the pace on the lent H100
    machine, whose host needs ~37 ms to queue one eager GPT-2 step (2026-11-27): at batch 8 (GPT-2)
    and 64 (ResNet-50) the GPU was done first and every contender was host-bound."""
    if smoke:
        return {
            "gpt2": GpuWorkload("gpt2", "GPU-bound", 2, lambda: TiedGPT(64, 16, 32, 2, 2), _tokens(64, 16),
                                "adamw", 3e-4),
            "resnet50": GpuWorkload("resnet50", "GPU-bound", 2, lambda: resnet((4, 8, 8, 8), (1, 1, 1, 1), 10),
                                    _images(32, 10), "sgd", 1e-2, channels_last=True),
            "gpt": GpuWorkload("gpt", "launch-bound", 2, lambda: TinyGPT(64, 16, 32, 2, 2), _tokens(64, 16),
                               "adamw", 3e-4),
        }
    return {
        "gpt2": GpuWorkload("gpt2", "GPU-bound", 16, lambda: TiedGPT(50304, 1024, 768, 12, 12), _tokens(50304, 1024),
                            "adamw", 3e-4),
        "resnet50": GpuWorkload("resnet50", "GPU-bound", 256, resnet, _images(224, 1000), "sgd", 1e-2,
                                channels_last=True),
        "gpt": GpuWorkload("gpt", "launch-bound", 64, TinyGPT, _tokens(256, 128), "adamw", 3e-4),
    }


WORKLOAD_NAMES = ("gpt", "gpt2", "resnet50")  # the launch-bound one first: cheapest, and it shows host costs
