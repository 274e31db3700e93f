"""The training loop: distributed, mixed-precision, token-normalised gradient accumulation,
checkpoints that resume the same data stream, summaries and validation BLEU.

One optimisation step is `accum_steps` microbatches per replica. Each microbatch adds the
gradient of its *summed* label-smoothed loss to a per-replica accumulator; the update
all-reduces the accumulators and divides by the number of target tokens in the whole
step, so 2 accumulated batches of B give the same update as one batch of 2B.
"""

import dataclasses
import math
import os
import time
from typing import Callable, Dict, Optional

import keras
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig, WarmupSchedule
from keras_transformer.losses import correct_tokens, label_smoothed_cross_entropy
from trainer import distribute
from trainer import input_pipeline

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss)."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How to train, as opposed to what (TransformerConfig) and on what (Data).

    Attributes:
      model_dir: checkpoints, vocabulary, config.json and TensorBoard summaries.
      train_steps: total optimiser updates; a resumed run stops at the same total.
      precision: one of PRECISIONS.
      jit_compile: XLA-compile the forward and backward pass.
      accum_steps: microbatches per update and replica.
      warmup_steps, learning_rate_scale: the schedule of section 5.3.
      eval_every, checkpoint_every, keep_checkpoints, log_every: in updates.
      beam_size, alpha: decoding for validation BLEU.
      bleu_sentences: validation sentences translated for BLEU (0: all).
      max_train_minutes: wall-time budget of this invocation's training loop (0: none);
        when spent, training checkpoints and stops before train_steps.
    """

    model_dir: str
    train_steps: int = 1000
    precision: str = "float32"
    jit_compile: bool = False
    accum_steps: int = 1
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    eval_every: int = 1000
    checkpoint_every: int = 500
    keep_checkpoints: int = 5
    log_every: int = 10
    beam_size: int = 4
    alpha: float = 0.6
    bleu_sentences: int = 0
    max_train_minutes: float = 0.0

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        for name in ("train_steps", "accum_steps", "eval_every", "checkpoint_every",
                     "keep_checkpoints", "log_every", "beam_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def make_optimizer(model_config: TransformerConfig, run: RunConfig) -> keras.optimizers.Optimizer:
    """Adam(0.9, 0.98, 1e-9) on the warm-up schedule; loss scaling for float16."""
    optimizer = keras.optimizers.Adam(
        WarmupSchedule(model_config.d_model, run.warmup_steps, run.learning_rate_scale),
        beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    if run.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


class Trainer:
    """Owns the model, optimizer, data iterator and checkpoints of one run.

    Args:
      model_config: the architecture.
      run: how to train.
      data: from `trainer.input_pipeline.build`.
      strategy: from `trainer.distribute.make_strategy`.
      evaluate_bleu: optional callable(model) -> dict of validation metrics (BLEU).
    """

    def __init__(self, model_config: TransformerConfig, run: RunConfig,
                 data: input_pipeline.Data, strategy: tf.distribute.Strategy,
                 evaluate_bleu: Optional[Callable[[Transformer], Dict[str, float]]] = None):
        self.config, self.run, self.data, self.strategy = model_config, run, data, strategy
        self.evaluate_bleu = evaluate_bleu
        self.chief = distribute.is_chief(strategy)
        with strategy.scope():
            self.model = Transformer(model_config, dtype=run.precision)
            self.model.build()
            self.optimizer = make_optimizer(model_config, run)
            self.optimizer.build(self.model.trainable_variables)
            on_read = dict(synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM, trainable=False)
            self.gradient_sums = [
                tf.Variable(tf.zeros(v.shape, tf.float32), name=f"grad_{i}", **on_read)
                for i, v in enumerate(self.model.trainable_variables)]
            # loss sum, target tokens, correct tokens, source tokens
            self.stat_sums = tf.Variable(tf.zeros([4]), name="stats", **on_read)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, distribute.worker_dir(run.model_dir),
            max_to_keep=run.keep_checkpoints, checkpoint_name="ckpt")
        self.accumulate = tf.function(self._accumulate)
        self.apply = tf.function(self._apply)
        self.gradients = tf.function(self._gradients, jit_compile=run.jit_compile)
        self.forward = tf.function(lambda source_ids, target_input_ids: self.model(
            (source_ids, target_input_ids), training=False), reduce_retracing=True)
        writer_dir = (os.path.join(run.model_dir, "train") if self.chief else
                      os.path.join(distribute.worker_dir(run.model_dir), "train"))
        self.writer = tf.summary.create_file_writer(writer_dir)
        self.eval_writer = tf.summary.create_file_writer(
            os.path.join(distribute.worker_dir(run.model_dir), "eval"))

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def restore(self) -> int:
        """Restores the latest checkpoint, if any, and positions the data stream after the
        batches it consumed; returns the step it holds.

        tf.distribute iterators cannot be checkpointed, so the training stream is
        deterministic (seeded shuffle, ordered maps) and a resumed run skips the
        step * accum_steps batches per replica that the checkpointed run consumed.
        """
        latest = tf.train.latest_checkpoint(self.run.model_dir)
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
        consumed = self.step * self.run.accum_steps
        self.iterator = iter(input_pipeline.distribute(
            self.strategy, lambda context: self.data.train_dataset(context).skip(consumed)))
        return self.step

    def _gradients(self, source_ids, target_input_ids, target_output_ids):
        with tf.GradientTape() as tape:
            logits = self.model((source_ids, target_input_ids), training=True)
            loss_sum, tokens = label_smoothed_cross_entropy(target_output_ids, logits,
                                                            self.config.label_smoothing)
            scaled = (self.optimizer.scale_loss(loss_sum)
                      if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
                      else loss_sum)
        grads = tape.gradient(scaled, self.model.trainable_variables)
        stats = tf.stack([loss_sum, tokens, correct_tokens(target_output_ids, logits),
                          tf.reduce_sum(tf.cast(source_ids != 0, tf.float32))])
        return [tf.convert_to_tensor(g) for g in grads], stats

    def _accumulate(self, iterator):
        """One microbatch per replica: adds its summed-loss gradients to the accumulators."""

        def step_fn(batch):
            (source_ids, target_input_ids), target_output_ids = batch
            grads, stats = self.gradients(source_ids, target_input_ids, target_output_ids)
            for total, grad in zip(self.gradient_sums, grads):
                total.assign_add(tf.cast(grad, tf.float32))
            self.stat_sums.assign_add(stats)

        self.strategy.run(step_fn, args=(next(iterator),))

    def _apply(self):
        """One update from the accumulated gradients; returns the step's statistics."""

        def apply_fn():
            context = tf.distribute.get_replica_context()
            stats = context.all_reduce(tf.distribute.ReduceOp.SUM, self.stat_sums.read_value())
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                       [g.read_value() for g in self.gradient_sums])
            grads = [g / tf.maximum(stats[1], 1.0) for g in grads]
            is_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
            scale = self.optimizer.dynamic_scale if is_scaled else tf.constant(1.0)
            learning_rate = self.optimizer.learning_rate
            # The gradients are already summed over replicas and identical on each; the
            # optimizer sums them again, so hand it 1/replicas of the total.
            replicas = tf.cast(context.num_replicas_in_sync, tf.float32)
            self.optimizer.apply_gradients(
                zip([g / replicas for g in grads], self.model.trainable_variables))
            for g in self.gradient_sums:
                g.assign(tf.zeros_like(g))
            self.stat_sums.assign(tf.zeros_like(self.stat_sums))
            return {"loss": stats[0] / tf.maximum(stats[1], 1.0),
                    "token_accuracy": stats[2] / tf.maximum(stats[1], 1.0),
                    "target_tokens": stats[1], "source_tokens": stats[3],
                    "gradient_norm": tf.linalg.global_norm(grads) / tf.cast(scale, tf.float32),
                    "loss_scale": tf.cast(scale, tf.float32),
                    "learning_rate": tf.cast(learning_rate, tf.float32)}

        per_replica = self.strategy.run(apply_fn)
        return tf.nest.map_structure(lambda t: self.strategy.experimental_local_results(t)[0],
                                     per_replica)

    def validation_loss(self) -> Dict[str, float]:
        """Label-smoothed loss and token accuracy over one pass of the validation split."""
        totals = tf.zeros([3])
        for (source_ids, target_input_ids), target_output_ids in self.data.eval_dataset():
            logits = self.forward(source_ids, target_input_ids)
            loss_sum, tokens = label_smoothed_cross_entropy(target_output_ids, logits,
                                                            self.config.label_smoothing)
            totals += tf.stack([loss_sum, tokens, correct_tokens(target_output_ids, logits)])
        loss_sum, tokens, correct = (float(x) for x in totals.numpy())
        return {"loss": loss_sum / max(tokens, 1.0), "token_accuracy": correct / max(tokens, 1.0)}

    def evaluate(self, step: int) -> Dict[str, float]:
        metrics = self.validation_loss()
        if self.evaluate_bleu is not None:
            metrics.update(self.evaluate_bleu(self.model))
        with self.eval_writer.as_default(step=step):
            for name, value in metrics.items():
                tf.summary.scalar(name, value)
        self.eval_writer.flush()
        return metrics

    def save(self, step: int):
        self.manager.save(checkpoint_number=step)
        if not self.chief:  # every worker takes part in saving; only the chief keeps it
            tf.io.gfile.rmtree(distribute.worker_dir(self.run.model_dir))

    def train(self, log: Callable[[str], None] = print) -> Dict[str, float]:
        """Trains from the latest checkpoint (if any) to `run.train_steps` updates.

        Returns the last step's statistics and validation metrics.
        Raises TrainingError on a non-finite loss, naming the step; the last checkpoint,
        written before that step, is kept.
        """
        run = self.run
        step = self.restore()
        if step:
            log(f"resumed from {tf.train.latest_checkpoint(run.model_dir)} at step {step}")
        if step >= run.train_steps:
            log(f"already at step {step} of {run.train_steps}; nothing to train")
            return {}
        progress = keras.utils.Progbar(run.train_steps, stateful_metrics=[
            "loss", "lr", "tok/s"], verbose=1 if self.chief else 0, interval=1.0)
        progress.update(step)
        metrics, last_time, tokens_since = {}, time.time(), 0.0
        deadline = time.time() + 60 * run.max_train_minutes if run.max_train_minutes else None
        while step < run.train_steps:
            for _ in range(run.accum_steps):
                self.accumulate(self.iterator)
            stats = {k: float(v) for k, v in self.apply().items()}
            if not math.isfinite(stats["loss"]):
                raise TrainingError(
                    f"non-finite loss ({stats['loss']}) at step {step + 1}; stopping. The last "
                    f"good checkpoint is {tf.train.latest_checkpoint(run.model_dir)}")
            step = self.step
            tokens_since += stats["source_tokens"] + stats["target_tokens"]
            if step % run.log_every == 0 or step == run.train_steps:
                elapsed = time.time() - last_time
                stats["tokens_per_second"] = tokens_since / max(elapsed, 1e-9)
                if self.chief:
                    with self.writer.as_default(step=step):
                        for name, value in stats.items():
                            tf.summary.scalar(name, value)
                progress.update(step, [("loss", stats["loss"]), ("lr", stats["learning_rate"]),
                                       ("tok/s", stats["tokens_per_second"])])
                last_time, tokens_since = time.time(), 0.0
            out_of_time = deadline is not None and time.time() > deadline
            if out_of_time:
                log(f"\ntime budget of {run.max_train_minutes:g} minutes spent at step {step}")
            last = step == run.train_steps or out_of_time
            if step % run.checkpoint_every == 0 or last:
                self.save(step)
            if self.chief and (step % run.eval_every == 0 or last):
                metrics = self.evaluate(step)
                log(f"\nstep {step}: " + ", ".join(f"validation {k} {v:.4g}"
                                                    for k, v in metrics.items()))
            if out_of_time:
                break
        self.writer.flush()
        return {**{f"train_{k}": v for k, v in stats.items()}, **metrics}
