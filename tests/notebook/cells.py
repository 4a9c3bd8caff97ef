"""The notebook's cells: what a user types, with the Trainer of one flavour (ours, `lightning.pytorch`
or `pytorch_lightning`). Classes and datasets are defined in cells; nothing here is importable by a
worker, so what a rank runs travels by pickle or is inherited by fork."""

from __future__ import annotations

IMPORTS = {
    "ours": "from trainer import LightningDataModule, LightningModule, Trainer\n"
            "from trainer.callbacks import Callback",
    "lightning.pytorch": "from lightning.pytorch import LightningDataModule, LightningModule, Trainer\n"
                         "from lightning.pytorch.callbacks import Callback",
    "pytorch_lightning": "from pytorch_lightning import LightningDataModule, LightningModule, Trainer\n"
                         "from pytorch_lightning.callbacks import Callback",
}


def setup(flavor: str) -> str:
    return f"""
import os, socket, sys, threading, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
{IMPORTS[flavor]}
"""


DATA = '''
class Squares(Dataset):
    """64 points in 8 dimensions and their mean squares: a dataset defined in a cell."""

    def __init__(self, n=64):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=generator)
        self.y = self.x.pow(2).mean(1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


class SquaresData(LightningDataModule):
    def train_dataloader(self):
        return DataLoader(Squares(), batch_size=8)
'''

MODEL = '''
class Net(LightningModule):
    def __init__(self, width=16, fail_on_rank=-1, exit_on_rank=-1, marker=""):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1))
        self.fail_on_rank, self.exit_on_rank, self.marker = fail_on_rank, exit_on_rank, marker

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_rank == self.fail_on_rank and batch_idx == 1:
            raise ValueError(f"bad batch {batch_idx} on rank {self.global_rank}")
        if self.global_rank == self.exit_on_rank and batch_idx == 1:
            os.write(2, f"rank {self.global_rank} leaves with os._exit(3)\\n".encode())  # its stderr, as C code writes
            os._exit(3)
        if self.marker:
            with open(self.marker, "w") as steps:
                steps.write(str(self.global_step))
            time.sleep(0.05)
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
'''

FIT = '''
def fit(model, datamodule=None, max_epochs=2, **options):
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp_notebook", max_epochs=max_epochs, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **options)
    started = time.perf_counter()
    trainer.fit(model, datamodule=datamodule or SquaresData())
    return round(time.perf_counter() - started, 2)


def one_process(seed, width=16, epochs=2):
    """The same training in this process alone, on the global batch (2 ranks x 8) in the order the
    training sampler deals it (shuffled each epoch from seed 0 + epoch, as DistributedSampler is)."""
    torch.manual_seed(seed)
    model = Net(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Squares()
    for epoch in range(epochs):
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, len(data), 16):
            batch = order[start:start + 16]
            optimizer.zero_grad()
            nn.functional.mse_loss(model.net(data.x[batch]), data.y[batch]).backward()
            optimizer.step()
    return model


def matches_one_process(model, seed, width=16):
    return difference_from_one_process(model, seed, width) <= 1e-5


def difference_from_one_process(model, seed, width=16):
    """The largest absolute difference from the same training in one process (0.0: the same weights)."""
    reference = one_process(seed, width).state_dict()
    return max(float((value - reference[key]).abs().max()) for key, value in model.state_dict().items())


def save_weights(model, name):
    torch.save({key: value.detach().clone() for key, value in model.state_dict().items()}, name)
'''

TWO_TRAINERS = '''
torch.manual_seed(0)
first = Net()
first_s = fit(first)
save_weights(first, "first.pt")
torch.manual_seed(1)
second = Net(width=12)
second_s = fit(second)
save_weights(second, "second.pt")
[difference_from_one_process(first, 0), difference_from_one_process(second, 1, width=12), first_s, second_s]
'''

# The objects of issue #36 that Lightning's ddp_notebook carries (it forks) and pickling cannot.
UNPICKLABLE = '''
class WithLock(Net):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


class WithSocket(Net):
    def __init__(self):
        super().__init__()
        self.sock = socket.socket()


class WithGenerator(Net):
    def __init__(self):
        super().__init__()
        self.numbers = (number for number in range(3))


class GuardedData(SquaresData):
    def __init__(self):
        super().__init__()
        self.guard = threading.Lock()


class CountingCallback(Callback):
    def __init__(self):
        self.g = (number for number in range(10**6))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass
'''

UNPICKLABLE_FITS = {
    "module_with_a_lock": "model = WithLock(); fit(model)",
    "module_with_a_socket": "model = WithSocket(); fit(model)",
    "module_with_a_generator": "model = WithGenerator(); fit(model)",
    "datamodule_with_a_lock": "model = Net(); fit(model, GuardedData())",
    "callback_with_a_generator": "model = Net(); fit(model, callbacks=[CountingCallback()])",
}


def unpicklable_fit(case: str) -> str:
    return f'torch.manual_seed(0)\n{UNPICKLABLE_FITS[case]}\nsave_weights(model, "{case}.pt")\nmatches_one_process(model, 0)'
