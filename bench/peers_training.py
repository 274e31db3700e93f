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
             torch.autocast("cpu", bfloat16) for mixed_bfloat16;
  keras-hub-xla, torch-compile
             the same with their compilers: keras-hub's update compiled by XLA
             (tf.function(jit_compile=True), what Keras' `fit` does by default), torch's
             model by torch.compile (Inductor, C++ kernels; needs a C++ compiler).

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

Model FLOPs: machine.update_flops (PaLM appendix B: matmuls only, position-wise ones on
the tokens, attention on the padded blocks, backward = 2x forward; the formula is in
bench/machine.py), one count for all: work done at padding is lost MFU.
The causal half of self-attention is counted (every implementation computes it). MFU =
model FLOP/s / the matmul peak of that precision: the best of TF's and torch's chained
2048^3 matmuls (float32; bfloat16 in, bfloat16 out), measured at the start, before each
precision's rows and at the end, the best of all (other processes only ever lower a
measurement); "own peak" takes the implementation's own framework's best instead. The
breakdown (--breakdown_reps) times the pieces of one update of each implementation on one
batch of the most frequent pool shape.

The implementations are in bench/peers.py; this file is the harness (pool, turns, timing,
peaks, report). Install the peers for this benchmark only (they are not runtime dependencies):

  pip install torch==2.13.0          # the local CPU wheel; no other version (CUDA: GBs)
  pip install keras-hub --dry-run    # must not change keras / tensorflow / tensorflow-text
  pip install keras-hub --no-deps && pip install tokenizers --no-deps

Not a test: run it by hand from the repository root (default ~7 minutes on 2 cores),

  python bench/peers_training.py [--pool=10 --passes=2 --precisions=float32,mixed_bfloat16]

and copy the table into the README.
"""

import argparse
import dataclasses
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
import tensorflow as tf
import torch

import keras_transformer
from trainer.data import input_pipeline, sources

import machine
from machine import (MATMUL_CHAIN, MATMUL_SIZE, MULTI30K, median_seconds, seconds,
                     tf_matmul_peak)
from peers import Batch, KerasHub, Ours, Torch

IMPLEMENTATIONS = ("ours", "keras-hub", "keras-hub-xla", "torch", "torch-compile")


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
                elif name.startswith("keras-hub"):
                    impls.append(KerasHub(config, precision, pool, args.schedule_warmup_steps,
                                          0.0 if args.peer_dropout == "paper" else None,
                                          jit_compile=name.endswith("-xla")))
                else:
                    impls.append(Torch(config, precision, pool, args.schedule_warmup_steps,
                                       args.peer_dropout == "paper",
                                       compile=name.endswith("-compile")))
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
        framework = "torch" if row.name.startswith("torch") else "tf"
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
