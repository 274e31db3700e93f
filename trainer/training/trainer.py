"""The training loop: distributed, mixed-precision updates with token-normalised gradient
accumulation, until the step total or the time budget, with checkpoints, validation and
progress at their intervals.

One optimisation step is `accum_steps` microbatches per replica. Each microbatch adds the
gradient of its *summed* label-smoothed loss to a per-replica accumulator; the update
all-reduces the accumulators and divides by the number of target tokens in the whole
step, so 2 accumulated batches of B give the same update as one batch of 2B.
"""

import math
import time
from typing import Callable, Dict, NamedTuple, Optional

import keras
import tensorflow as tf

from keras_transformer import (Transformer, TransformerConfig, WarmupSchedule, correct_tokens,
                               label_smoothed_cross_entropy)
from keras_transformer.special_ids import PAD_ID
from trainer.config import RunConfig
from trainer.data.input_pipeline import Data
from trainer.training import distribute
from trainer.training.checkpointing import Checkpointer
from trainer.training.validation import Validator
from trainer.training.progress import ProgressLog, StepStatistics


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss)."""


class Totals(NamedTuple):
    """Sums over the microbatches of one update, per replica (float32 scalars)."""

    loss_sum: tf.Tensor
    target_tokens: tf.Tensor
    correct_tokens: tf.Tensor
    source_tokens: tf.Tensor


def make_optimizer(model_config: TransformerConfig, run: RunConfig) -> keras.optimizers.Optimizer:
    """Adam(0.9, 0.98, 1e-9) on the warm-up schedule (section 5.3); loss scaling for
    float16."""
    optimizer = keras.optimizers.Adam(
        WarmupSchedule(model_config.d_model, run.warmup_steps, run.learning_rate_scale),
        beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    if run.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


class Trainer:
    """Trains a model from the latest checkpoint to `run.train_steps` updates.

    Args:
      model: the Transformer, built under `strategy.scope()` with run.precision.
      optimizer: from `make_optimizer`, built on the model's variables in the same scope.
      data: the run's data.
      strategy: from `trainer.training.distribute.make_strategy`.
      run: how to train (steps, accumulation, intervals, time budget).
      checkpointer: saves and restores the model and optimizer.
      validator: validation at `run.eval_every`, on the chief; None for none.
      log: where the trainer's own lines go (resume, budget, validation).
    """

    def __init__(self, model: Transformer, optimizer: keras.optimizers.Optimizer, data: Data,
                 strategy: tf.distribute.Strategy, run: RunConfig, checkpointer: Checkpointer,
                 validator: Optional[Validator] = None, log: Callable[[str], None] = print):
        self.model, self.optimizer, self.data, self.strategy = model, optimizer, data, strategy
        self.run, self.checkpointer, self.validator, self.log = run, checkpointer, validator, log
        self.chief = distribute.is_chief()
        with strategy.scope():
            on_read = dict(synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM, trainable=False)
            self.gradient_sums = [
                tf.Variable(tf.zeros(v.shape, tf.float32), name=f"grad_{i}", **on_read)
                for i, v in enumerate(model.trainable_variables)]
            self.totals = Totals(*(tf.Variable(0.0, name=name, **on_read)
                                   for name in Totals._fields))
        self.accumulate = tf.function(self._accumulate)
        self.apply = tf.function(self._apply)
        self.gradients = tf.function(self._gradients, jit_compile=run.jit_compile)
        self.iterator = None

    @property
    def step(self) -> int:
        return self.checkpointer.step

    def restore(self) -> int:
        """Restores the latest checkpoint and positions the training stream after it;
        returns the step."""
        step = self.checkpointer.restore()
        self.iterator = self.checkpointer.training_stream(self.strategy, self.data,
                                                          self.run.accum_steps)
        return step

    def _gradients(self, source_ids, target_input_ids, target_output_ids):
        """Gradients of one microbatch's summed loss, and its Totals."""
        with tf.GradientTape() as tape:
            logits = self.model((source_ids, target_input_ids), training=True)
            loss_sum, tokens = label_smoothed_cross_entropy(target_output_ids, logits,
                                                            self.model.config.label_smoothing)
            scaled = (self.optimizer.scale_loss(loss_sum)
                      if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
                      else loss_sum)
        grads = tape.gradient(scaled, self.model.trainable_variables)
        totals = Totals(loss_sum, tokens, correct_tokens(target_output_ids, logits),
                        tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.float32)))
        return [tf.convert_to_tensor(g) for g in grads], totals

    def _accumulate(self, iterator):
        """One microbatch per replica: adds its summed-loss gradients to the accumulators."""

        def step_fn(batch):
            (source_ids, target_input_ids), target_output_ids = batch
            grads, totals = self.gradients(source_ids, target_input_ids, target_output_ids)
            for total, grad in zip(self.gradient_sums, grads):
                total.assign_add(tf.cast(grad, tf.float32))
            for total, value in zip(self.totals, totals):
                total.assign_add(value)

        self.strategy.run(step_fn, args=(next(iterator),))

    def _apply(self) -> StepStatistics:
        """One update from the accumulated gradients; returns the step's statistics."""

        def apply_fn():
            context = tf.distribute.get_replica_context()
            totals = Totals(*context.all_reduce(tf.distribute.ReduceOp.SUM,
                                                [t.read_value() for t in self.totals]))
            tokens = tf.maximum(totals.target_tokens, 1.0)
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                       [g.read_value() for g in self.gradient_sums])
            grads = [g / tokens for g in grads]
            is_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
            scale = self.optimizer.dynamic_scale if is_scaled else tf.constant(1.0)
            learning_rate = self.optimizer.learning_rate
            # The gradients are already summed over replicas and identical on each; the
            # optimizer sums them again, so hand it 1/replicas of the total.
            replicas = tf.cast(context.num_replicas_in_sync, tf.float32)
            self.optimizer.apply_gradients(
                zip([g / replicas for g in grads], self.model.trainable_variables))
            for variable in [*self.gradient_sums, *self.totals]:
                variable.assign(tf.zeros_like(variable))
            scale = tf.cast(scale, tf.float32)
            return StepStatistics(
                loss=totals.loss_sum / tokens, token_accuracy=totals.correct_tokens / tokens,
                target_tokens=totals.target_tokens, source_tokens=totals.source_tokens,
                gradient_norm=tf.linalg.global_norm(grads) / scale, loss_scale=scale,
                learning_rate=tf.cast(learning_rate, tf.float32))

        per_replica = self.strategy.run(apply_fn)
        return tf.nest.map_structure(lambda t: self.strategy.experimental_local_results(t)[0],
                                     per_replica)

    def train(self) -> Dict[str, float]:
        """Trains from the latest checkpoint (if any) to `run.train_steps` updates, or
        until `run.max_train_minutes` are spent.

        Returns the last step's statistics (train_*) and validation metrics.
        Raises TrainingError on a non-finite loss, naming the step; the last checkpoint,
        written before that step, is kept.
        """
        run = self.run
        step = self.restore()
        if step:
            self.log(f"resumed from {self.checkpointer.latest} at step {step}")
        if step >= run.train_steps:
            self.log(f"already at step {step} of {run.train_steps}; nothing to train")
            return {}
        deadline = time.time() + 60 * run.max_train_minutes if run.max_train_minutes else None
        progress = ProgressLog(run.model_dir, run.train_steps, run.log_every, step, deadline,
                               enabled=self.chief)
        metrics = {}
        while step < run.train_steps:
            for _ in range(run.accum_steps):
                self.accumulate(self.iterator)
            stats = StepStatistics(*(float(value) for value in self.apply()))
            if not math.isfinite(stats.loss):
                progress.close()
                raise TrainingError(
                    f"non-finite loss ({stats.loss}) at step {step + 1}; stopping. The last "
                    f"good checkpoint is {self.checkpointer.latest}")
            step = self.step
            progress.update(step, stats)
            out_of_time = deadline is not None and time.time() > deadline
            if out_of_time:
                progress.end_line()
                self.log(f"time budget of {run.max_train_minutes:g} minutes spent at step {step}")
            last = step == run.train_steps or out_of_time
            if step % run.checkpoint_every == 0 or last:
                self.checkpointer.save(step)
            if self.validator is not None and self.chief and (step % run.eval_every == 0 or last):
                progress.end_line()
                metrics = self.validator(step)
                self.log(f"step {step}: " + ", ".join(f"validation {k} {v:.4g}"
                                                      for k, v in metrics.items()))
            if out_of_time:
                break
        progress.close()
        return {**{f"train_{k}": v for k, v in stats._asdict().items()}, **metrics}
