"""Our Trainer as bench/training.py runs it alone: `trainer.training.loop.Trainer` built
with the recipe's update (`our_trainer`) and fed by the real input pipeline, each batch it
consumes recorded (`RecordingData`), its updates timed one by one as `Trainer.train` runs
them, the first update of each new batch shape set apart, and the pieces of one update
timed on a cached batch; one table row per call of `measure_row`. A library for
bench/training.py; nothing here is run.
"""

import collections
import dataclasses
import os
import statistics
import tempfile
import time
from typing import List, NamedTuple, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from trainer.config import RunConfig
from trainer.data import input_pipeline
from trainer.data import tokenizer as tokenizer_lib
from trainer.main_job import build_trainer
from trainer.training import distribute
from trainer.training.loop import Trainer

import common


def our_trainer(model_config, data, precision: str, args, model_dir: str,
                jit_compile: bool = False, train_steps: int = 10 ** 6) -> Trainer:
    """A Trainer of the recipe's update on `data`: the model and batches of the caller's
    config, Adam on the warm-up schedule, the label-smoothed loss; not the recipe's
    moving average or cooldown, which the figures in docs/performance.md leave out (seed
    first: the same initial weights every time). args: bench/training.py's."""
    run = RunConfig(model_dir=model_dir, train_steps=train_steps, precision=precision,
                    jit_compile=jit_compile, warmup_steps=args.schedule_warmup_steps)
    trainer = build_trainer(model_config, data, run, distribute.make_strategy(0))
    trainer.restore()
    return trainer


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
            trainer.update.accumulate(trainer.stream.next())
        stats = trainer.update.apply()
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
    update = trainer.update
    ms = {
        "forward (inference)": common.median_seconds(
            lambda: forward(source_ids, target_input_ids), reps),
        "forward + backward": common.median_seconds(
            lambda: update.gradients(source_ids, target_input_ids, target_output_ids), reps),
        "accumulate (+ sum into accumulators)": common.median_seconds(
            lambda: update.accumulate(next(cached)), reps),
        "apply (all-reduce, Adam)": common.median_seconds(update.apply, reps),
    }
    flops = common.update_flops(trainer.model.config, *source_ids.shape,
                                target_input_ids.shape[1],
                                int(tf.math.count_nonzero(source_ids)),
                                int(tf.math.count_nonzero(target_input_ids)))
    return {name: 1000 * seconds for name, seconds in ms.items()}, flops


def steady_updates(timed: List[Update], batches: List[BatchRecord],
                   warmup: List[BatchRecord]):
    """(the timed updates with their batches, those set apart): the first update of a
    shape traces or compiles (oneDNN primitives, XLA), a cost paid once per shape in a run
    of thousands of updates, so it is set apart."""
    for update, batch in zip(timed, batches):
        if update.tokens != batch.source_tokens + batch.target_tokens:
            raise RuntimeError("the recorded batches are not the ones the trainer consumed")
    seen = {batch[:3] for batch in warmup}
    steady, first_of_shape = [], []
    for update, batch in zip(timed, batches):
        (first_of_shape if batch[:3] not in seen else steady).append((update, batch))
        seen.add(batch[:3])
    if not steady:  # too few timed updates to set any apart
        steady, first_of_shape = first_of_shape, []
    return steady, first_of_shape


def measure_row(precision: str, jit_compile: bool, data, model_config, args, peak) -> Result:
    """One row: --warmup_steps untimed updates, then --steps timed ones, then the breakdown
    (args: bench/training.py's); peak: the matmul peak of the row's precision (GFLOP/s, or
    None)."""
    # The same initial weights for every row. Seeding clears TF's eager kernel cache, which
    # frees the (kernel-owned) SentencePiece resource of every existing Tokenizer: build a
    # new one after it. A fresh records list: no other iterator appends to it.
    keras.utils.set_random_seed(0)
    tokenizer = tokenizer_lib.Tokenizer(data.tokenizers.target.model_proto)
    data = dataclasses.replace(data, tokenizers=tokenizer_lib.Tokenizers(tokenizer, tokenizer),
                               records=[])
    with tempfile.TemporaryDirectory() as model_dir:
        trainer = our_trainer(model_config, data, precision, args, model_dir, jit_compile,
                              train_steps=args.warmup_steps + args.steps)
        warmup = time_updates(trainer, args.warmup_steps)
        timed = time_updates(trainer, args.steps)
        batches = data.records[args.warmup_steps:args.warmup_steps + args.steps]
        steady, first_of_shape = steady_updates(timed, batches,
                                                data.records[:args.warmup_steps])
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
        flops=sum(common.update_flops(model_config, *b) for _, b in steady),
        first_loss=warmup[0].loss, mean_loss=statistics.mean(u.loss for u in timed),
        last_loss=timed[-1].loss, first_of_shape=[u.seconds for u, _ in first_of_shape],
        shapes=shapes, breakdown=pieces, breakdown_flops=pieces_flops)
