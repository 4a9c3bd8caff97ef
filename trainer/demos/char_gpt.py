"""A tiny character-level GPT, nanoGPT-style: small enough to read in one sitting.

token + position embeddings -> n_layer x [LayerNorm -> causal self-attention -> residual,
LayerNorm -> MLP -> residual] -> LayerNorm -> linear head tied to the token embedding.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainer.demos.common import check_positive, configure_optimizer
from trainer.module import LightningModule


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads): each head attends independently.
        q, k, v = (t.view(batch, time, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(batch, time, channels))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(LightningModule):
    """Predicts the next character; batches are `(tokens, next_tokens)` of shape (B, T).

    `vocab_size` and `block_size` usually come from `TextDataModule` (`ddp-train` fills them
    when the config leaves them null).
    """

    def __init__(self, vocab_size: int = 128, block_size: int = 64, n_layer: int = 2, n_head: int = 4,
                 n_embd: int = 64, dropout: float = 0.0, lr: float = 3e-3, optimizer: str = "adamw",
                 weight_decay: float = 0.01, scheduler: str | None = None) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer),
                            ("n_head", n_head), ("n_embd", n_embd)):
            check_positive(name, value)
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
        self.save_hyperparameters()
        self.token_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.token_emb.weight  # weight tying: one matrix reads and writes tokens
        self.apply(self._init_weights)
        for name, param in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, T, vocab_size) for token ids of shape (B, T), T <= block_size."""
        time = idx.shape[1]
        if time > self.hparams.block_size:
            raise ValueError(f"sequence length {time} exceeds block_size={self.hparams.block_size}")
        positions = torch.arange(time, device=idx.device)
        x = self.drop(self.token_emb(idx) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch), on_step=False, on_epoch=True, sync_dist=True, prog_bar=True)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        return configure_optimizer(self, hp.optimizer, hp.lr, hp.weight_decay, scheduler=hp.scheduler)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Append `max_new_tokens` sampled tokens to `idx` (B, T), cropping the context to block_size."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.hparams.block_size:])[:, -1, :] / max(temperature, 1e-6)
            next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)
            idx = torch.cat([idx, next_token], dim=1)
        return idx
