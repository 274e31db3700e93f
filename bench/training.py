"""Benchmark: training throughput and model FLOPs utilisation (MFU) of the Multi30k recipe.

In one process, on this machine:

  1. the matmul peak: best GFLOP/s of chained 2048 x 2048 x 2048 matmuls in a
     tf.function, in float32 and in bfloat16 (bfloat16 inputs and output, as
     Keras' mixed_bfloat16 Dense layers run them), at the start and again just
     before each row, against which that row's MFU is taken;
  2. for each precision (and, with --jit_compile, with XLA): a `trainer.training.trainer.Trainer`
     on the recipe of trainer/flagfiles/multi30k.cfg (`small` model, shared 8000-piece
     vocabulary, max_len 64, 4096 padded tokens per batch, Adam on the warm-up
     schedule, label-smoothed loss), fed by the real input pipeline; --warmup_steps
     updates (tracing, first shapes) are run and not timed, then --steps updates are
     timed as `Trainer.train` runs them (accumulate, apply; no host read in between).
     A timed update whose batch shape is new pays a one-off compilation (oneDNN
     primitives; XLA) and is reported apart, not in the rates;
  3. model FLOPs of every timed update from the config and that update's batch shape,
     and MFU = achieved model FLOP/s / the matmul peak of the same precision;
  4. optionally (--breakdown_reps) where one update's time goes, on one cached batch
     of the most frequent shape: forward, forward + backward, accumulate, apply.

Model FLOPs: machine.update_flops, the matmul count written out in bench/machine.py
(its forward count equals the sum over the MatMul and BatchMatMul ops of the traced
forward graph). Embedding lookups, biases, LayerNorm, softmax, dropout, the loss and Adam are not counted,
so they show up as lost MFU. Not a test: run it by hand from the repository root,

  python bench/training.py [--steps=30 --warmup_steps=10 --jit_compile=both ...]

(defaults: about 2 minutes on the 2 idle cores, 5 on a shared machine; --jit_compile=both
doubles it) and copy its table into the README.
"""

import argparse
import collections
import dataclasses
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

import keras_transformer
from trainer.config import PRECISIONS, RunConfig
from trainer.data import input_pipeline, sources
from trainer.data import tokenizer as tokenizer_lib
from trainer.training import distribute
from trainer.training.run import build_trainer
from trainer.training.trainer import Trainer

import machine
from machine import (MATMUL_CHAIN, MATMUL_SIZE, MULTI30K, median_seconds, tf_matmul_peak,
                     update_flops)

# The matmul dtype a precision's Dense layers run in. No MFU for mixed_float16: a CPU has
# no float16 matmul units, so there is no peak to hold it against.
PEAK_DTYPES = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16}


# ---------------------------------------------------------------- data


class BatchRecord(NamedTuple):
    batch: int
    source_len: int
    target_len: int
    source_tokens: int  # non-pad
    target_tokens: int


@dataclasses.dataclass(frozen=True)
class RecordingData(input_pipeline.Data):
    """The trainer's Data, whose training batches also append a BatchRecord to `records`,
    in the order the trainer consumes them: its iterator lives inside a tf.function and
    shows no shapes."""

    records: list = dataclasses.field(default_factory=list)

    def train_dataset(self, input_context=None, num_epochs=None):
        def record(source_ids, target_output_ids):
            source, target = source_ids.numpy(), target_output_ids.numpy()
            self.records.append(BatchRecord(*source.shape, target.shape[1],
                                            int(np.count_nonzero(source)),
                                            int(np.count_nonzero(target))))
            return 0

        def tap(features, target_output_ids):
            done = tf.py_function(record, [features[0], target_output_ids], tf.int32)
            with tf.control_dependencies([done]):
                return tf.nest.map_structure(tf.identity, (features, target_output_ids))

        # A sequential map after the prefetch: records are in consumption order.
        return super().train_dataset(input_context, num_epochs).map(tap)


# ---------------------------------------------------------------- measurements


@dataclasses.dataclass
class Result:
    """One row: totals over the timed updates but the first of each new batch shape."""

    precision: str
    jit_compile: bool
    peak: Optional[float]  # GFLOP/s; None: no matmul peak for this precision
    updates: int
    seconds: float
    cpu_seconds: float  # of this whole process, summed over its threads
    real_tokens: float  # non-pad source + target
    padded_tokens: int
    flops: int
    first_loss: float  # of the first (warm-up) update
    mean_loss: float  # over all timed updates
    last_loss: float
    first_of_shape: List[float]  # seconds of the timed updates set apart
    shapes: collections.Counter  # (batch, length) -> timed updates
    breakdown: dict  # piece -> median ms, on a batch of shapes.most_common(1)
    breakdown_flops: int = 0  # update_flops of that batch

    @property
    def cpu_busy(self) -> float:
        """The share of all cores this process had over the timed updates."""
        return self.cpu_seconds / self.seconds / os.cpu_count()

    @property
    def mfu(self) -> Optional[float]:
        """Model FLOP/s over the matmul peak."""
        return self.flops / self.seconds / 1e9 / self.peak if self.peak else None


class Update(NamedTuple):
    seconds: float
    cpu_seconds: float  # of this whole process, summed over its threads
    loss: float
    tokens: float  # non-pad source + target, by the trainer's own count


def time_updates(trainer: Trainer, steps: int) -> List[Update]:
    """`steps` updates as Trainer.train runs them (accumulate, apply; statistics left on
    the device). Each update's statistics are read after its clock stops: TensorFlow
    runs a CPU function call to completion before returning, so the clock holds the
    whole update."""
    updates = []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(trainer.run.accum_steps):
            trainer.accumulate(trainer.stream.next())
        stats = trainer.apply()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        updates.append(Update(seconds, cpu_seconds, float(stats.loss),
                              float(stats.source_tokens + stats.target_tokens)))
    return updates


def breakdown(trainer: Trainer, data, shape, reps: int) -> Tuple[dict, int]:
    """Median milliseconds of the pieces of one update on one cached batch of `shape`, and
    the batch's update_flops."""
    for batch in data.train_dataset():  # the first batch of the wanted shape
        if tuple(batch[1].shape) == shape:
            break
    (source_ids, target_input_ids), target_output_ids = batch
    cached = iter(trainer.strategy.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.from_tensors(batch).repeat()))
    forward = tf.function(lambda source_ids, target_input_ids: trainer.model(
        (source_ids, target_input_ids), training=False))
    ms = {
        "forward (inference)": median_seconds(
            lambda: forward(source_ids, target_input_ids), reps),
        "forward + backward": median_seconds(
            lambda: trainer.gradients(source_ids, target_input_ids, target_output_ids), reps),
        "accumulate (+ sum into accumulators)": median_seconds(
            lambda: trainer.accumulate(next(cached)), reps),
        "apply (all-reduce, Adam)": median_seconds(trainer.apply, reps),
    }
    flops = update_flops(trainer.model.config, *source_ids.shape, target_input_ids.shape[1],
                         int(tf.math.count_nonzero(source_ids)),
                         int(tf.math.count_nonzero(target_input_ids)))
    return {name: 1000 * seconds for name, seconds in ms.items()}, flops


def run_precision(precision: str, jit_compile: bool, data, model_config, args, peak):
    # The same initial weights for every row. Seeding clears TF's eager kernel cache, which
    # frees the (kernel-owned) SentencePiece resource of every existing Tokenizer: build a
    # new one after it. A fresh records list: no other iterator appends to it.
    keras.utils.set_random_seed(0)
    tokenizer = tokenizer_lib.Tokenizer(data.tokenizers.target.model_proto)
    data = dataclasses.replace(data, tokenizers=tokenizer_lib.Tokenizers(tokenizer, tokenizer),
                               records=[])
    with tempfile.TemporaryDirectory() as model_dir:
        run = RunConfig(model_dir=model_dir, train_steps=args.warmup_steps + args.steps,
                        precision=precision, jit_compile=jit_compile,
                        warmup_steps=args.schedule_warmup_steps)
        trainer = build_trainer(model_config, data, run, distribute.make_strategy(0))
        trainer.restore()
        warmup = time_updates(trainer, args.warmup_steps)
        timed = time_updates(trainer, args.steps)
        batches = data.records[args.warmup_steps:args.warmup_steps + args.steps]
        for update, batch in zip(timed, batches):
            if update.tokens != batch.source_tokens + batch.target_tokens:
                raise RuntimeError("the recorded batches are not the ones the trainer consumed")
        # The first update of a shape traces or compiles (oneDNN primitives, XLA): a cost
        # paid once per shape in a run of thousands of updates, so it is set apart.
        seen = {batch[:3] for batch in data.records[:args.warmup_steps]}
        steady, first_of_shape = [], []
        for update, batch in zip(timed, batches):
            (first_of_shape if batch[:3] not in seen else steady).append((update, batch))
            seen.add(batch[:3])
        if not steady:  # too few timed updates to set any apart
            steady, first_of_shape = first_of_shape, []
        shapes = collections.Counter((batch.batch, batch.source_len) for batch in batches)
        pieces, pieces_flops = {}, 0
        if args.breakdown_reps:
            pieces, pieces_flops = breakdown(trainer, data, shapes.most_common(1)[0][0],
                                             args.breakdown_reps)
    return Result(
        precision, jit_compile, peak, updates=len(steady),
        seconds=sum(u.seconds for u, _ in steady),
        cpu_seconds=sum(u.cpu_seconds for u, _ in steady),
        real_tokens=sum(u.tokens for u, _ in steady),
        padded_tokens=sum(b.batch * (b.source_len + b.target_len) for _, b in steady),
        flops=sum(update_flops(model_config, *b) for _, b in steady),
        first_loss=warmup[0].loss, mean_loss=statistics.mean(u.loss for u in timed),
        last_loss=timed[-1].loss, first_of_shape=[u.seconds for u, _ in first_of_shape],
        shapes=shapes, breakdown=pieces, breakdown_flops=pieces_flops)


# ---------------------------------------------------------------- report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(MULTI30K), help="the Multi30k directory")
    parser.add_argument("--steps", type=int, default=30, help="timed updates per row")
    parser.add_argument("--warmup_steps", type=int, default=10,
                        help="untimed updates before them (tracing, first shapes)")
    parser.add_argument("--precisions", default="float32,mixed_bfloat16",
                        help=f"comma-separated, of {', '.join(PRECISIONS)}")
    parser.add_argument("--jit_compile", choices=("false", "true", "both"), default="false",
                        help="XLA-compile forward and backward; both: a row each way")
    parser.add_argument("--batch_tokens", type=int, default=4096)
    parser.add_argument("--max_len", type=int, default=64)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--schedule_warmup_steps", type=int, default=1000,
                        help="the learning-rate schedule's warm-up (the recipe's)")
    parser.add_argument("--peak_runs", type=int, default=10)
    parser.add_argument("--breakdown_reps", type=int, default=5,
                        help="timed calls per piece of the update breakdown (0: skip it)")
    args = parser.parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    for precision in precisions:
        if precision not in PRECISIONS:
            parser.error(f"unknown precision {precision!r}")
    if args.steps < 1 or args.warmup_steps < 1:
        parser.error("--steps and --warmup_steps must be at least 1")
    jit_modes = {"false": [False], "true": [True], "both": [False, True]}[args.jit_compile]
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + sys.argv[1:])
    load_before = os.getloadavg()

    peaks = {"float32": [tf_matmul_peak(tf.float32, args.peak_runs)],
             "bfloat16": [tf_matmul_peak(tf.bfloat16, args.peak_runs)]}

    data_dir = Path(args.data)
    data_config = machine.multi30k_data(data_dir, vocab_size=args.vocab_size,
                                        max_len=args.max_len, batch_tokens=args.batch_tokens)
    with tempfile.TemporaryDirectory() as vocab_dir:
        built = input_pipeline.build(sources.select(data_config), vocab_dir, data_config)
    data = RecordingData(**{f.name: getattr(built, f.name)
                            for f in dataclasses.fields(input_pipeline.Data)})
    model_config = keras_transformer.TransformerConfig.small(
        vocab_size=data.tokenizers.target.vocab_size)

    results = []
    for jit_compile in jit_modes:
        for precision in precisions:
            print(f"{precision}{', XLA' if jit_compile else ''} ...", flush=True)
            # The peak of the row's precision again just before it: other processes on
            # the machine slow both down alike, not a peak taken minutes earlier.
            matmul_dtype = PEAK_DTYPES.get(precision)
            peak = None
            if matmul_dtype is not None:
                peak = tf_matmul_peak(matmul_dtype, args.peak_runs)
                peaks[matmul_dtype.name].append(peak)
            results.append(run_precision(precision, jit_compile, data, model_config, args,
                                         peak))
    load_after = os.getloadavg()

    params = keras_transformer.Transformer(model_config)
    params.build()
    shapes = collections.Counter()
    for result in results:
        shapes.update(result.shapes)
    header = [
        ("machine", f"{machine.describe()}; load average {load_before[0]:.1f} before, "
                    f"{load_after[0]:.1f} after"),
        ("versions", f"Python {platform.python_version()}, TensorFlow {tf.__version__}, "
                     f"Keras {keras.__version__}, TF_ENABLE_ONEDNN_OPTS="
                     f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset (on)')}"),
        ("command", command),
        ("matmul peak", f"{MATMUL_CHAIN} chained {MATMUL_SIZE}^3 matmuls, best of "
                        f"{args.peak_runs} calls, at the start and before each row (GFLOP/s): "
                        + "; ".join(f"{name} " + ", ".join(f"{p:,.0f}" for p in values)
                                    for name, values in peaks.items())),
        ("data", f"Multi30k en->de, {data.report}"),
        ("recipe", f"TransformerConfig.small ({params.count_params() / 1e6:.2f}M parameters, "
                   f"vocabulary {model_config.vocab_size}), max_len {args.max_len}, "
                   f"batch_tokens {args.batch_tokens}, 1 replica, Adam, schedule warm-up "
                   f"{args.schedule_warmup_steps}"),
        ("timing", f"{args.warmup_steps} untimed then {args.steps} timed updates per row, "
                   "fed by the input pipeline; rates leave out the first "
                   "update of a new shape; batch shapes timed (batch x length: updates): "
                   + ", ".join(f"{b}x{l}: {n}" for (b, l), n in sorted(
                       shapes.items(), key=lambda item: item[0][1]))),
    ]
    print()
    for name, value in header:
        print(f"{name:>11}: {value}")
    print()
    def percent(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    print("| precision | XLA | updates/s | tokens/s (real src+tgt) | tokens/s (padded) "
          "| model GFLOP/s | peak GFLOP/s | MFU | CPU busy | loss: first -> mean timed -> last |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(f"| {r.precision} | {'yes' if r.jit_compile else 'no'} "
              f"| {r.updates / r.seconds:.3f} | {r.real_tokens / r.seconds:,.0f} "
              f"| {r.padded_tokens / r.seconds:,.0f} | {r.flops / r.seconds / 1e9:,.0f} "
              f"| {f'{r.peak:,.0f}' if r.peak else '-'} | {percent(r.mfu)} "
              f"| {100 * r.cpu_busy:.0f}% "
              f"| {r.first_loss:.2f} -> {r.mean_loss:.2f} -> {r.last_loss:.2f} |")
    print("\nCPU busy: this process's CPU time over the timed updates / (wall time x cores). "
          "Well short of 100%, other processes\nhad the rest, and the MFU compares updates "
          "and a peak that met different loads: rerun on a quiet machine.")
    if any(r.first_of_shape for r in results):
        print("\nSet apart, not in the rates: the first timed update of a shape that no "
              "earlier update had (seconds): " + "; ".join(
                  f"{r.precision}{' XLA' if r.jit_compile else ''} "
                  + ", ".join(f"{s:.1f}" for s in r.first_of_shape)
                  for r in results if r.first_of_shape))
    if any(r.breakdown for r in results):
        print("\nOne update on a cached batch of the most frequent shape, median ms "
              f"of {args.breakdown_reps} (MFU against the row's peak above):\n")
        names = list(next(r.breakdown for r in results if r.breakdown))
        print("| precision | XLA | shape | " + " | ".join(names) + " | MFU of forward + backward |")
        print("|---|---|---|" + "---:|" * (len(names) + 1))
        for r in results:
            if not r.breakdown:
                continue
            batch, length = r.shapes.most_common(1)[0][0]
            seconds = r.breakdown["forward + backward"] / 1000
            mfu = percent(r.breakdown_flops / seconds / 1e9 / r.peak if r.peak else None)
            print(f"| {r.precision} | {'yes' if r.jit_compile else 'no'} | {batch}x{length} | "
                  + " | ".join(f"{r.breakdown[n]:,.0f}" for n in names) + f" | {mfu} |")


if __name__ == "__main__":
    main()
