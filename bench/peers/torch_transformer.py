"""The paper's Transformer as torch.nn.Transformer (`TorchTransformer`), its training
runner (`TorchTrainer`) and torch's matmul peak (`matmul_peak`)."""

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

import keras_transformer

from common import MATMUL_CHAIN, MATMUL_SIZE, best_seconds
from peers import Batch


def matmul_peak(dtype_name: str, runs: int) -> float:
    """Best GFLOP/s of MATMUL_CHAIN chained n^3 torch.matmul calls in `dtype_name`
    ("float32" or "bfloat16")."""
    n = MATMUL_SIZE
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, n, generator=generator).to(dtype)
    w = (torch.randn(n, n, generator=generator) * n ** -0.5).to(dtype)

    def chain():
        y = x
        for _ in range(MATMUL_CHAIN):
            y = torch.matmul(y, w)
        return float(y[0, 0])

    chain()
    return MATMUL_CHAIN * 2 * n ** 3 / best_seconds(chain, runs) / 1e9


def sinusoids(length: int, d_model: int) -> torch.Tensor:
    """The paper's PE [length, d_model]: sin in even columns, cos in odd ones."""
    positions = torch.arange(length, dtype=torch.float32)[:, None]
    angles = positions / torch.pow(10000.0, torch.arange(0, d_model, 2) / d_model)[None, :]
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).reshape(length, d_model)


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with a tied, sqrt(d)-scaled embedding and sinusoidal positions."""

    def __init__(self, config: keras_transformer.TransformerConfig, paper_dropout: bool):
        super().__init__()
        d = config.d_model
        self.d_model = d
        self.embedding = nn.Embedding(config.vocab_size, d)
        nn.init.normal_(self.embedding.weight, std=d ** -0.5)
        self.register_buffer("positions", sinusoids(config.max_length, d), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        self.transformer = nn.Transformer(
            d_model=d, nhead=config.num_heads, num_encoder_layers=config.num_layers,
            num_decoder_layers=config.num_layers, dim_feedforward=config.d_ff,
            dropout=config.dropout, batch_first=True, layer_norm_eps=1e-6)
        # The paper's post-norm stacks end with their last sublayer's LayerNorm.
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        if paper_dropout:
            for block in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
                block.dropout = nn.Identity()  # inside the FFN, after the ReLU
                for attention in (block.self_attn, getattr(block, "multihead_attn", None)):
                    if attention is not None:
                        attention.dropout = 0.0  # on the attention weights

    def embed(self, ids):
        x = self.embedding(ids) * math.sqrt(self.d_model)
        return self.dropout(x + self.positions[:ids.shape[1]])

    def forward(self, source_ids, target_input_ids):
        pad = source_ids == 0
        length = target_input_ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(length)
        y = self.transformer(self.embed(source_ids), self.embed(target_input_ids),
                             tgt_mask=causal, tgt_is_causal=True,
                             src_key_padding_mask=pad, memory_key_padding_mask=pad)
        return F.linear(y, self.embedding.weight)  # [batch, tgt_len, vocab]


def warmup_lr(d_model: int, warmup: int, step: int) -> float:
    """keras_transformer.WarmupSchedule in Python (LambdaLR passes the update count)."""
    step = max(step, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


class TorchTrainer:
    """TorchTransformer, eager: forward (autocast for bfloat16), backward, Adam step;
    compile: the model's forward and backward compiled by torch.compile (Inductor's C++
    kernels on a CPU), the optimizer eager."""

    def __init__(self, config, precision, pool, schedule_warmup, paper_dropout,
                 compile=False):
        self.name = "torch.compile" if compile else "torch"
        torch.manual_seed(0)
        self.config, self.position = config, 0
        self.autocast = precision == "mixed_bfloat16"
        self.pool = [tuple(torch.from_numpy(x).long() for x in dataclasses.astuple(b))
                     for b in pool]
        self.model = TorchTransformer(config, paper_dropout).train()
        self.params = sum(p.numel() for p in self.model.parameters())
        if compile:
            self.model = torch.compile(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.0, betas=(0.9, 0.98),
                                          eps=1e-9)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: warmup_lr(config.d_model, schedule_warmup, step))

    def _loss(self, source_ids, target_input_ids, target_output_ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.model(source_ids, target_input_ids)
        loss_sum = F.cross_entropy(logits.float().flatten(0, 1), target_output_ids.flatten(),
                                   ignore_index=0, label_smoothing=self.config.label_smoothing,
                                   reduction="sum")
        return loss_sum / (target_output_ids != 0).sum().clamp(min=1)

    def _apply(self):
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _update(self, batch) -> float:
        loss = self._loss(*batch)
        loss.backward()
        self._apply()
        return loss.item()

    def update(self) -> float:
        batch = self.pool[self.position % len(self.pool)]
        self.position += 1
        return self._update(batch)

    def pieces(self, batch: Batch):
        args = tuple(torch.from_numpy(x).long() for x in dataclasses.astuple(batch))

        def forward():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                 enabled=self.autocast):
                return float(self.model(*args[:2])[0, 0, 0])

        def forward_backward():
            loss = self._loss(*args)
            loss.backward()
            return loss.item()

        def optimizer():  # gradients of the last forward + backward, kept
            self.optimizer.step()
            self.schedule.step()

        return {"forward": forward, "forward + backward": forward_backward,
                "optimizer": optimizer, "update": lambda: self._update(args)}
