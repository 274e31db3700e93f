"""The training loop: distributed, mixed-precision updates with token-normalised gradient
accumulation, until the step total or the time budget, with checkpoints, validation and
progress at their intervals.

One optimisation step is `accum_steps` microbatches per replica. Each microbatch adds the
gradient of its *summed* label-smoothed loss to a per-replica accumulator; the update
all-reduces the accumulators and divides by the number of target tokens in the whole
step, so 2 accumulated batches of B give the same update as one batch of 2B.

The update is one all-reduce (the gradient sums and the step's totals in one call), after
which Adam runs on each replica's copy of the variables from that replica's copy of the
reduced gradients (the cross-replica context: Keras' optimizer, called from a replica,
would all-reduce them again). Nothing is read back to the host between updates: the
statistics are read every `log_every` updates, and a non-finite loss is noted on the
device with its step and raised at the next read, before any checkpoint is written.

With `run.cooldown`, the schedule's rate is multiplied by `cooldown_factor`, computed on
the host before each update; the chief's factor travels in the same all-reduce, so every
worker applies the same one. So does whether the chief's time budget is spent, which every
worker reads at the same steps (every `log_every` updates): all stop at the same step,
where workers deciding by their own clocks could leave one waiting in an all-reduce.
"""

import functools
import time
from typing import Callable, Dict, NamedTuple, Optional

import keras
import tensorflow as tf

from keras_transformer import (Transformer, TransformerConfig, WarmupSchedule, correct_tokens,
                               label_smoothed_cross_entropy,
                               projected_label_smoothed_cross_entropy)
from keras_transformer.special_ids import PAD_ID
from trainer.config import RunConfig
from trainer.data.input_pipeline import Data
from trainer.training import distribute
from trainer.training.checkpointing import Checkpointer
from trainer.training.cooldown import cooldown_factor
from trainer.training.preemption import PreemptionWatcher
from trainer.training.training_stream import TrainingStream
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
        # float16: the loss is scaled, and the update unscales and may skip (see _update).
        self.loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        with strategy.scope():
            on_read = dict(synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM, trainable=False)
            self.gradient_sums = [
                tf.Variable(tf.zeros(v.shape, tf.float32), name=f"grad_{i}", **on_read)
                for i, v in enumerate(model.trainable_variables)]
            self.totals = Totals(*(tf.Variable(0.0, name=name, **on_read)
                                   for name in Totals._fields))
            # Kept on the device between the host's reads (every log_every updates).
            self.tokens_since_read = tf.Variable(0.0, trainable=False, name="tokens_since_read")
            self.first_nonfinite_step = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                                    name="first_nonfinite_step")
            # Whether the chief's time budget was spent before the last update.
            self.budget_spent = tf.Variable(False, trainable=False, name="budget_spent")
        # Batches come from the host: one trace per few shapes, then a generic one.
        self.accumulate = tf.function(self._accumulate, reduce_retracing=True)
        self._apply_traced = tf.function(self._apply)
        self.gradients = tf.function(self._gradients, jit_compile=run.jit_compile)
        self.stream = None  # TrainingStream, from restore()

    @property
    def step(self) -> int:
        return self.checkpointer.step

    def restore(self) -> int:
        """Restores the latest checkpoint and positions the training stream after it;
        returns the step."""
        step = self.checkpointer.restore()
        self.stream = TrainingStream(self.strategy, self.data, self.run.model_dir,
                                     self.run.keep_checkpoints, self.run.accum_steps)
        self.stream.restore(step, self.log)
        return step

    def save(self, step: int) -> str:
        """Checkpoints `step`: the stream's position first, so a model checkpoint always
        has its stream's (kill -9 between the two leaves the previous pair); returns the
        model checkpoint's path."""
        self.stream.save(step)
        return self.checkpointer.save(step)

    def _gradients(self, source_ids, target_input_ids, target_output_ids):
        """Gradients of one microbatch's summed loss, and its Totals."""
        label_smoothing = self.model.config.label_smoothing
        with tf.GradientTape() as tape:
            if self.run.jit_compile:  # XLA needs static shapes: the padded batch
                logits = self.model((source_ids, target_input_ids), training=True)
                loss_sum, tokens = label_smoothed_cross_entropy(target_output_ids, logits,
                                                                label_smoothing)
                correct = correct_tokens(target_output_ids, logits)
            else:  # nothing computed at padding, the projection inside the loss
                outputs, packing = self.model.packed_logits(
                    (source_ids, target_input_ids), training=True, project=False)
                loss_sum, tokens, correct = projected_label_smoothed_cross_entropy(
                    packing.pack(target_output_ids), outputs, self.model.embedding.matrix(),
                    label_smoothing)
            scaled = (self.optimizer.scale_loss(loss_sum) if self.loss_scaled
                      else loss_sum)
        grads = tape.gradient(scaled, self.model.trainable_variables)
        totals = Totals(loss_sum, tokens, correct,
                        tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.float32)))
        return [tf.convert_to_tensor(g) for g in grads], totals

    def _accumulate(self, batch):
        """One microbatch per replica (`TrainingStream.next`): adds its summed-loss
        gradients to the accumulators."""

        def step_fn(batch):
            (source_ids, target_input_ids), target_output_ids = batch
            grads, totals = self.gradients(source_ids, target_input_ids, target_output_ids)
            for total, grad in zip(self.gradient_sums, grads):
                total.assign_add(tf.cast(grad, tf.float32))
            for total, value in zip(self.totals, totals):
                total.assign_add(value)

        self.strategy.run(step_fn, args=(batch,))

    def apply(self, learning_rate_factor: float = 1.0, budget_spent: bool = False
              ) -> StepStatistics:
        """One update from the accumulated gradients, with one all-reduce, at the
        schedule's learning rate times `learning_rate_factor`; `self.budget_spent` becomes
        `budget_spent` (both the chief's: see the module docstring). Returns the step's
        statistics as tensors (Trainer.train reads them every log_every updates)."""
        return self._apply_traced(tf.constant(learning_rate_factor, tf.float32),
                                  tf.constant(float(budget_spent)))

    def _apply(self, learning_rate_factor: tf.Tensor, budget_spent: tf.Tensor
               ) -> StepStatistics:
        """`apply`, traced once: the factor and the flag are float32 [] tensors."""

        def reduce_fn():
            context = tf.distribute.get_replica_context()
            chief_only = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
            # The one all-reduce of the update: the totals and the chief's factor and
            # budget flag travel with the gradients.
            reduced = context.all_reduce(
                tf.distribute.ReduceOp.SUM,
                [t.read_value() for t in self.totals]
                + [learning_rate_factor * chief_only, budget_spent * chief_only]
                + [g.read_value() for g in self.gradient_sums])
            fields = len(Totals._fields)
            totals = Totals(*reduced[:fields])
            factor, spent = reduced[fields], reduced[fields + 1]
            tokens = tf.maximum(totals.target_tokens, 1.0)
            scale = self._loss_scale()
            grads = [g / (tokens * scale) for g in reduced[fields + 2:]]
            for variable in [*self.gradient_sums, *self.totals]:
                variable.assign(tf.zeros_like(variable))
            return grads, spent > 0.5, StepStatistics(
                loss=totals.loss_sum / tokens, token_accuracy=totals.correct_tokens / tokens,
                target_tokens=totals.target_tokens, source_tokens=totals.source_tokens,
                gradient_norm=tf.linalg.global_norm(grads), loss_scale=scale,
                learning_rate=tf.cast(self.optimizer.learning_rate, tf.float32) * factor)

        grads, spent, stats = self.strategy.run(reduce_fn)
        spent, stats = tf.nest.map_structure(
            lambda t: self.strategy.experimental_local_results(t)[0], (spent, stats))
        self.budget_spent.assign(spent)
        self._update(grads, finite=tf.math.is_finite(stats.gradient_norm),
                     learning_rate=stats.learning_rate)
        if self.checkpointer.moving_average is not None:
            self.checkpointer.moving_average.update(
                self.strategy, self.model.trainable_variables, self.optimizer.iterations)
        self.tokens_since_read.assign_add(stats.source_tokens + stats.target_tokens)
        # The first update whose loss is not finite, kept until the host reads it.
        bad = tf.logical_and(tf.logical_not(tf.math.is_finite(stats.loss)),
                             self.first_nonfinite_step == 0)
        self.first_nonfinite_step.assign(tf.where(
            bad, tf.cast(self.optimizer.iterations, tf.int64), self.first_nonfinite_step))
        return stats

    def _loss_scale(self) -> tf.Tensor:
        """float16's dynamic loss scale, 1 for other precisions (float32 [])."""
        if self.loss_scaled:
            return tf.cast(self.optimizer.dynamic_scale, tf.float32)
        return tf.constant(1.0)

    def _update(self, grads, finite, learning_rate):
        """Adam at `learning_rate` on every replica's copy of the variables, from that
        replica's copy of the all-reduced gradients, in the cross-replica context: Keras'
        apply, called from a replica, would all-reduce them a second time.

        float16: the gradients are the same on every replica, and so is `finite`; a
        non-finite update is skipped (still counted in iterations, as tf.keras did) and
        the loss scale halves, every `dynamic_growth_steps` finite ones double it, as
        keras.optimizers.LossScaleOptimizer does.
        """
        optimizer = self.optimizer
        adam = optimizer.inner_optimizer if self.loss_scaled else optimizer

        def apply_adam():
            for grad, variable in zip(grads, self.model.trainable_variables):
                self.strategy.extended.update(
                    variable.value, lambda v, g: adam.update_step(g, v, learning_rate),
                    args=(grad,), group=False)

        if not self.loss_scaled:
            apply_adam()
        else:
            tf.cond(finite, apply_adam, lambda: None)
            grow = tf.logical_and(finite, tf.equal(optimizer.step_counter,
                                                   optimizer.dynamic_growth_steps - 1))
            optimizer.dynamic_scale.assign(optimizer.dynamic_scale * tf.where(
                finite, tf.where(grow, 2.0, 1.0), 0.5))
            optimizer.step_counter.assign(tf.where(
                tf.logical_and(finite, tf.logical_not(grow)), optimizer.step_counter + 1, 0))
        adam.iterations.assign_add(1)

    def train(self) -> Dict[str, float]:
        """Trains from the latest checkpoint (if any) to `run.train_steps` updates, or
        until `run.max_train_minutes` are spent.

        Returns the last step's statistics (train_*) and validation metrics.
        Raises TrainingError on a non-finite loss, naming the step; the last checkpoint,
        written before that step, is kept. Raises Preempted after SIGTERM or SIGINT, with
        a checkpoint of the update in flight (trainer/training/preemption.py).
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
        save = functools.partial(self._save_on_preemption, progress)
        with PreemptionWatcher(self.strategy, save) as preemption:
            try:
                metrics, stats = self._train_loop(step, progress, deadline, preemption)
            finally:
                progress.close()
        return {**{f"train_{k}": float(v) for k, v in stats._asdict().items()}, **metrics}

    def _train_loop(self, step: int, progress: ProgressLog, deadline: Optional[float],
                    preemption: PreemptionWatcher):
        """Updates from `step` to run.train_steps or the deadline; returns (validation
        metrics, the last step's statistics). Raises Preempted after a signal."""
        run, metrics = self.run, {}
        budget = 60 * run.max_train_minutes if deadline is not None else None
        while step < run.train_steps:
            for _ in range(run.accum_steps):
                self.accumulate(self.stream.next())
            now = time.time()
            factor = cooldown_factor(run.cooldown, step, run.train_steps,
                                     budget - (deadline - now) if budget else 0.0, budget)
            # Tensors: the host reads only at the intervals below.
            stats = self.apply(factor, budget_spent=budget is not None and now > deadline)
            step += 1
            # The chief's clock, read by every worker at the same steps (whatever budget
            # each was given).
            out_of_time = step % run.log_every == 0 and bool(self.budget_spent.numpy())
            last = step == run.train_steps or out_of_time
            if step % run.log_every == 0 or last:
                self._raise_if_nonfinite(progress)
                progress.update(step, stats, self._tokens_since_read())
            if out_of_time:
                progress.end_line()
                self.log(f"time budget of {run.max_train_minutes:g} minutes spent at step {step}"
                         if self.chief else f"the chief's time budget spent at step {step}")
            if step % run.checkpoint_every == 0 or last:
                self._raise_if_nonfinite(progress)
                self.save(step)
            # Validation can take longer than a preemption's grace period: not then.
            if (self.validator is not None and self.chief and not preemption.noted
                    and (step % run.eval_every == 0 or last)):
                progress.end_line()
                metrics = self._validate(step)
                self.log(f"step {step}: " + ", ".join(f"validation {k} {v:.4g}"
                                                      for k, v in metrics.items())
                         + (" (moving average)" if run.export_weights == "ema" else ""))
            if out_of_time:
                break
            preemption.after_update(step, stats)
        return metrics, stats

    def _validate(self, step: int) -> Dict[str, float]:
        """Validation metrics of the weights the export will ship: the moving average
        with export_weights=ema (swapped in for the call), else the live weights."""
        if self.run.export_weights != "ema":
            return self.validator(step)
        variables = self.model.trainable_variables
        live = [tf.identity(variable) for variable in variables]
        self.checkpointer.moving_average.copy_to(variables)
        try:
            return self.validator(step)
        finally:
            for variable, value in zip(variables, live):
                variable.assign(value)

    def _save_on_preemption(self, progress: ProgressLog, step: int, stats: StepStatistics
                            ) -> str:
        """The checkpoint of a preempted run's last update, logged and checked like any
        other; returns its path."""
        self._raise_if_nonfinite(progress)
        if step % self.run.log_every:
            progress.update(step, stats, self._tokens_since_read())
        progress.end_line()
        if step % self.run.checkpoint_every == 0:  # written already
            return self.checkpointer.latest
        return self.save(step)

    def _raise_if_nonfinite(self, progress: ProgressLog):
        """Raises TrainingError naming the first update whose loss was not finite, if any;
        the last checkpoint, written before it, is kept."""
        bad_step = int(self.first_nonfinite_step.numpy())
        if bad_step:
            progress.close()
            kept = (f"the last good checkpoint is {self.checkpointer.latest}"
                    if self.checkpointer.latest else "no checkpoint was written before it")
            raise TrainingError(f"non-finite loss at step {bad_step}; stopping: {kept}")

    def _tokens_since_read(self) -> float:
        """Source + target tokens of the updates since the last call (a host read)."""
        tokens = float(self.tokens_since_read.numpy())
        self.tokens_since_read.assign(0.0)
        return tokens
