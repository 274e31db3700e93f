"""Benchmark: training throughput and MFU against keras-hub and torch.nn.Transformer.

In one process, on the same Multi30k batches, the same architecture and the same precision:

  ours       keras_transformer.Transformer(TransformerConfig.small(V)) trained by
             trainer.training.trainer.Trainer exactly as in training (accumulate + apply under
             MirroredStrategy, label-smoothed loss, Adam on the warm-up schedule);
  keras-hub  a keras.Model of keras_hub.layers.TransformerEncoder / TransformerDecoder,
             ReversibleEmbedding (tied) and SinePositionEncoding, one tf.function step
             (GradientTape, the same loss, keras Adam on the same schedule);
  torch      torch.nn.Transformer + a tied nn.Embedding, torch.optim.Adam + LambdaLR on the
             same schedule, F.cross_entropy(label_smoothing=0.1), eager, 2 threads,
             torch.autocast("cpu", bfloat16) for mixed_bfloat16.

All three: N=3, d_model 256, d_ff 1024, 4 heads, post-norm, ReLU, sinusoidal positions,
embeddings scaled by sqrt(d_model), one matrix for source and target embeddings and the
pre-softmax projection, dropout 0.1 on embeddings and every sublayer output, label
smoothing 0.1 over non-pad targets, Adam(0.9, 0.98, 1e-9), lr = d^-0.5 min(s^-0.5, s w^-1.5).
Dropout sites: --peer_dropout=paper (default) sets the peers' attention-weight dropout
(keras-hub's and torch's `dropout` also apply there) and torch's dropout inside the FFN to
0, so every model drops out where the paper (section 5.4) and ours do; =native keeps the
peers' own 0.1 there. torch.nn.Transformer's extra final encoder/decoder LayerNorms are
removed (the paper's post-norm stack has none, nor have ours and keras-hub's).

Data: --pool real Multi30k training batches (shared SentencePiece vocabulary, max_len 64,
batch_tokens 4096 padded positions per side, seed 0), converted to numpy once. Each
implementation runs one untimed pass over the pool (tracing, every shape once), then
--passes timed passes; the implementations take turns update by update (each on the same
batch), so load from other processes falls on all of them alike. Every update is read back
(loss to the host) before the next, as Trainer.train does.

Model FLOPs: machine.update_flops (PaLM appendix B: matmuls only, on padded positions,
backward = 2x forward; the formula is in bench/machine.py), one count for all three.
The causal half of self-attention is counted (every implementation computes it). MFU =
model FLOP/s / the matmul peak of that precision: the best of TF's and torch's chained
2048^3 matmuls (float32; bfloat16 in, bfloat16 out), measured at the start, before each
precision's rows and at the end, the best of all (other processes only ever lower a
measurement); "own peak" takes the implementation's own framework's best instead. The
breakdown (--breakdown_reps) times the pieces of one update of each implementation on one
batch of the most frequent pool shape.

Install the peers for this benchmark only (they are not runtime dependencies):

  pip install torch==2.13.0          # the local CPU wheel; no other version (CUDA: GBs)
  pip install keras-hub --dry-run    # must not change keras / tensorflow / tensorflow-text
  pip install keras-hub --no-deps && pip install tokenizers --no-deps

Not a test: run it by hand from the repository root (default ~7 minutes on 2 cores),

  python bench/peers_training.py [--pool=10 --passes=2 --precisions=float32,mixed_bfloat16]

and copy the table into the README.
"""

import argparse
import dataclasses
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import keras
import keras_hub
import numpy as np
import tensorflow as tf
import torch
import torch.nn.functional as F
from torch import nn

import keras_transformer
from keras_transformer.losses import label_smoothed_cross_entropy
from trainer.config import RunConfig
from trainer.data import input_pipeline, sources
from trainer.training import distribute
from trainer.training.run import build_trainer

import machine
from machine import (MATMUL_CHAIN, MATMUL_SIZE, MULTI30K, median_seconds, seconds,
                     tf_matmul_peak, update_flops)

IMPLEMENTATIONS = ("ours", "keras-hub", "torch")


# ---------------------------------------------------------------- machine and peak


def torch_matmul_peak(dtype, runs: int) -> float:
    """Best GFLOP/s of MATMUL_CHAIN chained n^3 torch.matmul calls."""
    n = MATMUL_SIZE
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, n, generator=generator).to(dtype)
    w = (torch.randn(n, n, generator=generator) * n ** -0.5).to(dtype)

    def chain():
        y = x
        for _ in range(MATMUL_CHAIN):
            y = torch.matmul(y, w)
        return float(y[0, 0])

    chain()
    best = min(seconds(chain) for _ in range(runs))
    return MATMUL_CHAIN * 2 * n ** 3 / best / 1e9


# ---------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Batch:
    source_ids: np.ndarray         # int32 [batch, length]
    target_input_ids: np.ndarray   # int32 [batch, length]
    target_output_ids: np.ndarray  # int32 [batch, length]

    @property
    def shape(self):
        return self.source_ids.shape

    @property
    def real_tokens(self) -> int:
        return int(np.count_nonzero(self.source_ids) + np.count_nonzero(self.target_output_ids))

    @property
    def padded_tokens(self) -> int:
        return self.source_ids.size + self.target_output_ids.size

    def flops(self, config) -> int:
        return update_flops(config, self.shape[0], self.shape[1], self.target_output_ids.shape[1])


def pool_dataset(pool):
    """The pool's batches in order, as the trainer's ((source, target_in), target_out)."""
    datasets = [tf.data.Dataset.from_tensors(((b.source_ids, b.target_input_ids),
                                              b.target_output_ids)) for b in pool]
    dataset = datasets[0]
    for other in datasets[1:]:
        dataset = dataset.concatenate(other)  # shapes differ: the spec becomes [None, None]
    return dataset


@dataclasses.dataclass(frozen=True)
class PoolData(input_pipeline.Data):
    """The trainer's Data whose training stream repeats the pool (no pipeline threads
    compete with the step for the 2 cores)."""

    pool: tuple = ()

    def train_dataset(self, input_context=None, num_epochs=None):
        return pool_dataset(self.pool).repeat(num_epochs)


# ---------------------------------------------------------------- ours


class Ours:
    """trainer.training.trainer.Trainer on the pool: one update = accumulate + apply, as in training."""

    name = "ours"

    def __init__(self, config, precision, data, schedule_warmup, model_dir):
        keras.utils.set_random_seed(0)
        run = RunConfig(model_dir=model_dir, train_steps=10 ** 6, precision=precision,
                        warmup_steps=schedule_warmup)
        self.trainer = build_trainer(config, data, run, distribute.make_strategy(0))
        self.trainer.restore()
        self.params = self.trainer.model.count_params()

    def update(self) -> float:
        self.trainer.accumulate(self.trainer.stream.next())
        return float(self.trainer.apply().loss)

    def pieces(self, batch: Batch):
        t = self.trainer
        source, target_in, target_out = (tf.constant(x) for x in dataclasses.astuple(batch))
        cached = iter(t.strategy.distribute_datasets_from_function(
            lambda _: tf.data.Dataset.from_tensors(((source, target_in), target_out)).repeat()))
        forward = tf.function(lambda s, t_in: t.model((s, t_in), training=True))
        return {
            "forward": lambda: forward(source, target_in).numpy(),
            "forward + backward": lambda: [g.numpy() for g in t.gradients(
                source, target_in, target_out)[0][:1]],
            "optimizer": lambda: t.apply().loss.numpy(),
            "update": lambda: (t.accumulate(next(cached)), t.apply().loss.numpy()),
        }


# ---------------------------------------------------------------- keras-hub


class KerasHubTransformer(keras.Model):
    """The paper's encoder-decoder from keras-hub layers (post-norm, tied embeddings).

    Call: (source_ids, target_input_ids) int [batch, length] -> float32 logits
    [batch, tgt_len, vocab]. `encode`, `embed` and the layer lists serve decoding.
    """

    def __init__(self, config: keras_transformer.TransformerConfig, attention_dropout=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.config = config
        policy = dict(dtype=self.dtype_policy)
        layer = dict(intermediate_dim=config.d_ff, num_heads=config.num_heads,
                     dropout=config.dropout, layer_norm_epsilon=1e-6, **policy)
        self.embedding = keras_hub.layers.ReversibleEmbedding(
            config.vocab_size, config.d_model, tie_weights=True,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=config.d_model ** -0.5),
            name="embedding", **policy)
        self.positions = keras_hub.layers.SinePositionEncoding(**policy)
        self.source_dropout = keras.layers.Dropout(config.dropout, **policy)
        self.target_dropout = keras.layers.Dropout(config.dropout, **policy)
        self.encoder_layers = [keras_hub.layers.TransformerEncoder(name=f"encoder_{i}", **layer)
                               for i in range(config.num_layers)]
        self.decoder_layers = [keras_hub.layers.TransformerDecoder(name=f"decoder_{i}", **layer)
                               for i in range(config.num_layers)]
        dummy = keras.ops.ones((1, 2), "int32")  # one key: keras warns of a 1-wide softmax
        self((dummy, dummy))
        if attention_dropout is not None:
            # keras-hub's `dropout` also drops attention weights, which the paper does not;
            # Keras MHA reads the rate at call time.
            for block in self.encoder_layers + self.decoder_layers:
                for name in ("_self_attention_layer", "_cross_attention_layer"):
                    if getattr(block, name, None) is not None:
                        getattr(block, name)._dropout = attention_dropout

    def embed(self, ids, dropout, start_index=0, training=None):
        x = self.embedding(ids) * keras.ops.cast(math.sqrt(self.config.d_model), self.compute_dtype)
        return dropout(x + self.positions(x, start_index=start_index), training=training)

    def encode(self, source_ids, training=None):
        x = self.embed(source_ids, self.source_dropout, training=training)
        for block in self.encoder_layers:
            x = block(x, padding_mask=source_ids != 0, training=training)
        return x

    def logits(self, x):
        return keras.ops.cast(self.embedding(x, reverse=True), "float32")

    def call(self, inputs, training=None):
        source_ids, target_input_ids = inputs
        memory = self.encode(source_ids, training=training)
        y = self.embed(target_input_ids, self.target_dropout, training=training)
        for block in self.decoder_layers:
            y = block(y, memory, encoder_padding_mask=source_ids != 0, training=training)
        return self.logits(y)


class KerasHub:
    """KerasHubTransformer, one tf.function update: tape, summed smoothed loss / tokens, Adam."""

    name = "keras-hub"

    def __init__(self, config, precision, pool, schedule_warmup, attention_dropout):
        keras.utils.set_random_seed(0)
        self.config, self.pool, self.position = config, pool, 0
        self.model = KerasHubTransformer(config, attention_dropout, dtype=precision)
        self.params = self.model.count_params()
        self.optimizer = keras.optimizers.Adam(
            keras_transformer.WarmupSchedule(config.d_model, schedule_warmup),
            beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        self.optimizer.build(self.model.trainable_variables)
        spec = tf.TensorSpec([None, None], tf.int32)
        self.step = tf.function(self._step, input_signature=[spec] * 3)
        self.gradients = tf.function(self._gradients, input_signature=[spec] * 3)
        self.apply = tf.function(self._apply)
        self.forward = tf.function(lambda s, t: self.model((s, t), training=True),
                                   input_signature=[spec] * 2)

    def _gradients(self, source_ids, target_input_ids, target_output_ids):
        with tf.GradientTape() as tape:
            logits = self.model((source_ids, target_input_ids), training=True)
            loss_sum, tokens = label_smoothed_cross_entropy(target_output_ids, logits,
                                                            self.config.label_smoothing)
            loss = loss_sum / tf.maximum(tokens, 1.0)
        return tape.gradient(loss, self.model.trainable_variables), loss

    def _apply(self, grads):
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def _step(self, source_ids, target_input_ids, target_output_ids):
        grads, loss = self._gradients(source_ids, target_input_ids, target_output_ids)
        self._apply(grads)
        return loss

    def update(self) -> float:
        batch = self.pool[self.position % len(self.pool)]
        self.position += 1
        return float(self.step(*dataclasses.astuple(batch)))

    def pieces(self, batch: Batch):
        args = [tf.constant(x) for x in dataclasses.astuple(batch)]
        grads = self.gradients(*args)[0]
        return {
            "forward": lambda: self.forward(*args[:2]).numpy(),
            "forward + backward": lambda: [g.numpy() for g in self.gradients(*args)[0][:1]],
            "optimizer": lambda: (self.apply(grads), self.optimizer.iterations.numpy()),
            "update": lambda: self.step(*args).numpy(),
        }


# ---------------------------------------------------------------- torch


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


class Torch:
    """TorchTransformer, eager: forward (autocast for bfloat16), backward, Adam step."""

    name = "torch"

    def __init__(self, config, precision, pool, schedule_warmup, paper_dropout):
        torch.manual_seed(0)
        self.config, self.position = config, 0
        self.autocast = precision == "mixed_bfloat16"
        self.pool = [tuple(torch.from_numpy(x).long() for x in dataclasses.astuple(b))
                     for b in pool]
        self.model = TorchTransformer(config, paper_dropout).train()
        self.params = sum(p.numel() for p in self.model.parameters())
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


# ---------------------------------------------------------------- measurement


@dataclasses.dataclass
class Row:
    precision: str
    name: str
    params: int
    seconds: float = 0.0
    updates: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    flops: int = 0
    first_loss: float = float("nan")
    last_pass_loss: float = float("nan")
    peak: float = 0.0      # the machine's: the best of TF's and torch's over the run
    own_peak: float = 0.0  # the best of the implementation's framework over the run
    pieces: dict = dataclasses.field(default_factory=dict)

    @property
    def mfu(self) -> float:
        return self.flops / self.seconds / 1e9 / self.peak

    @property
    def own_mfu(self) -> float:
        return self.flops / self.seconds / 1e9 / self.own_peak


def timed_update(impl, batch: Batch, row: Row, config) -> float:
    """One update (the implementation takes the batch from its own copy of the pool, in the
    same order); adds it to the row's totals; returns its loss."""
    start = time.perf_counter()
    loss = impl.update()
    row.seconds += time.perf_counter() - start
    row.updates += 1
    row.real_tokens += batch.real_tokens
    row.padded_tokens += batch.padded_tokens
    row.flops += batch.flops(config)
    return loss


def build_pool(args):
    data_dir = Path(args.data)
    config = machine.multi30k_data(data_dir, vocab_size=args.vocab_size, max_len=args.max_len,
                                   batch_tokens=args.batch_tokens)
    with tempfile.TemporaryDirectory() as scratch:
        data = input_pipeline.build(sources.select(config), args.vocab_dir or scratch, config)
        pool = []
        for (source_ids, target_input_ids), target_output_ids in data.train_dataset().take(
                args.pool):
            pool.append(Batch(source_ids.numpy(), target_input_ids.numpy(),
                              target_output_ids.numpy()))
    return data, tuple(pool)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(MULTI30K), help="the Multi30k directory")
    parser.add_argument("--vocab_dir", default=None,
                        help="a directory holding spm.model to reuse (default: train one)")
    parser.add_argument("--pool", type=int, default=10, help="distinct batches, in order")
    parser.add_argument("--passes", type=int, default=3, help="timed passes over the pool")
    parser.add_argument("--precisions", default="float32,mixed_bfloat16")
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--peer_dropout", choices=("paper", "native"), default="paper")
    parser.add_argument("--batch_tokens", type=int, default=4096)
    parser.add_argument("--max_len", type=int, default=64)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--schedule_warmup_steps", type=int, default=1000)
    parser.add_argument("--peak_runs", type=int, default=10)
    parser.add_argument("--breakdown_reps", type=int, default=3,
                        help="timed calls per piece of the update breakdown (0: skip it)")
    args = parser.parse_args(argv)
    precisions = [p for p in args.precisions.split(",") if p]
    names = [n for n in args.implementations.split(",") if n]
    if set(precisions) - {"float32", "mixed_bfloat16"} or set(names) - set(IMPLEMENTATIONS):
        parser.error("precisions: float32, mixed_bfloat16; implementations: "
                     + ", ".join(IMPLEMENTATIONS))
    torch.set_num_threads(2)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + sys.argv[1:])
    loads = [os.getloadavg()]

    peaks = {"tf float32": [], "torch float32": [], "tf bfloat16": [], "torch bfloat16": []}

    def measure_peaks(precision_names):
        for p in precision_names:
            kind = "float32" if p == "float32" else "bfloat16"
            peaks[f"tf {kind}"].append(tf_matmul_peak(getattr(tf, kind), args.peak_runs))
            peaks[f"torch {kind}"].append(torch_matmul_peak(getattr(torch, kind), args.peak_runs))

    measure_peaks(precisions)
    data, pool = build_pool(args)
    config = keras_transformer.TransformerConfig.small(vocab_size=data.tokenizers.target.vocab_size)
    pool_data = PoolData(**{f.name: getattr(data, f.name)
                            for f in dataclasses.fields(input_pipeline.Data)}, pool=pool)
    shapes = {}
    for b in pool:
        shapes[b.shape] = shapes.get(b.shape, 0) + 1
    common = max(shapes, key=shapes.get)
    probe = next(b for b in pool if b.shape == common)

    rows = []
    for precision in precisions:
        print(f"{precision} ...", flush=True)
        measure_peaks([precision])
        with tempfile.TemporaryDirectory() as model_dir:
            impls = []
            for name in names:
                if name == "ours":
                    impls.append(Ours(config, precision, pool_data, args.schedule_warmup_steps,
                                      model_dir))
                elif name == "keras-hub":
                    impls.append(KerasHub(config, precision, pool, args.schedule_warmup_steps,
                                          0.0 if args.peer_dropout == "paper" else None))
                else:
                    impls.append(Torch(config, precision, pool, args.schedule_warmup_steps,
                                       args.peer_dropout == "paper"))
            table = [Row(precision, impl.name, impl.params) for impl in impls]
            for impl, row in zip(impls, table):  # untimed: tracing, every shape once
                row.first_loss = [impl.update() for _ in pool][0]
            loads.append(os.getloadavg())
            for _ in range(args.passes):
                losses = [[] for _ in impls]
                for batch in pool:  # turns: each implementation one update on the batch
                    for impl, row, row_losses in zip(impls, table, losses):
                        row_losses.append(timed_update(impl, batch, row, config))
                for row, row_losses in zip(table, losses):
                    row.last_pass_loss = statistics.mean(row_losses)
            loads.append(os.getloadavg())
            if args.breakdown_reps:
                for impl, row in zip(impls, table):
                    row.pieces = {piece: 1000 * median_seconds(fn, args.breakdown_reps)
                                  for piece, fn in impl.pieces(probe).items()}
            rows.extend(table)
            del impls
    loads.append(os.getloadavg())
    measure_peaks(precisions)
    for row in rows:
        kind = "float32" if row.precision == "float32" else "bfloat16"
        framework = "torch" if row.name == "torch" else "tf"
        row.own_peak = max(peaks[f"{framework} {kind}"])
        row.peak = max(max(values) for name, values in peaks.items() if name.endswith(kind))
    report(args, command, loads, peaks, data, config, pool, shapes, common, probe, rows)


def report(args, command, loads, peaks, data, config, pool, shapes, common, probe, rows):
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset (on)")
    header = [
        ("machine", machine.describe()),
        ("load", "os.getloadavg() 1-min at start, around each timed block, end: "
                 + ", ".join(f"{load[0]:.2f}" for load in loads)),
        ("versions", f"Python {platform.python_version()}, TensorFlow {tf.__version__}, "
                     f"Keras {keras.__version__}, keras-hub {keras_hub.__version__}, "
                     f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
                     f"TF_ENABLE_ONEDNN_OPTS={onednn}"),
        ("command", command),
        ("peak", f"{MATMUL_CHAIN} chained {MATMUL_SIZE}^3 matmuls, best of {args.peak_runs}, "
                 "at the start, before each precision and at the end (GFLOP/s): "
                 + "; ".join(f"{name} " + ", ".join(f"{p:,.0f}" for p in values)
                             for name, values in peaks.items() if values)),
        ("model", f"TransformerConfig.small: N={config.num_layers}, d_model {config.d_model}, "
                  f"d_ff {config.d_ff}, {config.num_heads} heads, vocabulary {config.vocab_size} "
                  f"(shared), dropout {config.dropout}, label smoothing {config.label_smoothing}; "
                  "peer dropout sites: " + args.peer_dropout),
        ("data", f"Multi30k en->de, {len(pool)} training batches (max_len {args.max_len}, "
                 f"batch_tokens {args.batch_tokens}), shapes (batch x length: count) "
                 + ", ".join(f"{b}x{l}: {n}" for (b, l), n in sorted(shapes.items(),
                                                                      key=lambda s: s[0][1]))
                 + f"; {sum(b.real_tokens for b in pool):,} real / "
                   f"{sum(b.padded_tokens for b in pool):,} padded src+tgt tokens per pass"),
        ("timing", f"1 untimed pass, then {args.passes} timed passes per implementation, "
                   "taking turns update by update; loss: first update -> mean of the last "
                   "pass"),
    ]
    print()
    for name, value in header:
        print(f"{name:>8}: {value}")
    print()
    print("| precision | implementation | parameters | updates/s | tokens/s (real src+tgt) "
          "| tokens/s (padded) | model GFLOP/s | MFU | MFU (own peak) | vs ours | loss |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    ours = {r.precision: r for r in rows if r.name == "ours"}
    for r in rows:
        base = ours.get(r.precision)
        versus = (f"{(r.updates / r.seconds) / (base.updates / base.seconds):.2f}x"
                  if base else "-")
        print(f"| {r.precision} | {r.name} | {r.params / 1e6:.2f}M | {r.updates / r.seconds:.3f} "
              f"| {r.real_tokens / r.seconds:,.0f} | {r.padded_tokens / r.seconds:,.0f} "
              f"| {r.flops / r.seconds / 1e9:,.0f} | {100 * r.mfu:.1f}% "
              f"| {100 * r.own_mfu:.1f}% | {versus} "
              f"| {r.first_loss:.2f} -> {r.last_pass_loss:.2f} |")
    print("\n(MFU: against the machine's matmul peak of the precision, the best of TF's and "
          "torch's in the run; own peak: against its own framework's best; vs ours: updates/s "
          "over ours, above 1 is faster than ours)")
    if any(r.pieces for r in rows):
        names = list(next(r for r in rows if r.pieces).pieces)
        flops = probe.flops(config)
        print(f"\nOne update on a {common[0]}x{common[1]} batch, median ms of {args.breakdown_reps}"
              " (forward: training mode, no gradient; ours: forward + backward = "
              "Trainer.gradients, optimizer = Trainer.apply (all-reduce, Adam, zeroing the "
              "accumulators), update = Trainer.accumulate + apply; peers: optimizer = the Adam "
              "step):\n")
        print("| precision | implementation | " + " | ".join(names)
              + " | MFU of forward + backward |")
        print("|---|---|" + "---:|" * (len(names) + 1))
        for r in rows:
            if r.pieces:
                mfu = 100 * flops / (r.pieces["forward + backward"] / 1000) / 1e9 / r.peak
                print(f"| {r.precision} | {r.name} | "
                      + " | ".join(f"{r.pieces[n]:,.0f}" for n in names) + f" | {mfu:.1f}% |")


if __name__ == "__main__":
    main()
