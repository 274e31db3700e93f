"""One optimisation step: distributed, mixed-precision updates with token-normalised
gradient accumulation.

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

With a dropout schedule (trainer/training/dropout_schedule.py), the chief's progress of the
run after the update travels in it too, and the update sets the rate that the model's
dropouts read in the updates that follow: a variable, so the update is traced once.

"""

from typing import NamedTuple, Optional

import keras
import tensorflow as tf

from keras_transformer import (Transformer, TransformerConfig, WarmupSchedule, correct_tokens,
                               label_smoothed_cross_entropy,
                               projected_label_smoothed_cross_entropy)
from keras_transformer.special_ids import PAD_ID
from trainer.config import RunConfig
from trainer.model_dir.ema import MovingAverage
from trainer.training.dropout_schedule import ScheduledRate
from trainer.training.progress import StepStatistics


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


class Updater:
    """The update of one model: microbatches accumulate (`accumulate`), then one
    all-reduce and Adam apply them (`apply`).

    Args:
      model: the Transformer, built under `strategy.scope()` with run.precision.
      optimizer: from `make_optimizer`, built on the model's variables in the same scope.
      strategy: from `trainer.training.distribute.make_strategy`.
      run: how to train (run.jit_compile).
      moving_average: the EMA of the weights, moved after every update; None for none.
      dropout: a dropout schedule's state, which the model's dropouts follow and each
        update advances; None: the model's fixed rate.
    """

    def __init__(self, model: Transformer, optimizer: keras.optimizers.Optimizer,
                 strategy: tf.distribute.Strategy, run: RunConfig,
                 moving_average: Optional[MovingAverage] = None,
                 dropout: Optional[ScheduledRate] = None):
        self.model, self.optimizer, self.strategy, self.run = model, optimizer, strategy, run
        self.moving_average, self.dropout = moving_average, dropout
        if dropout is not None:
            model.follow_dropout(dropout.rate)
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
        # Batches come from the host: one trace per few shapes, then a generic one, whose
        # numbers differ from a shape's own trace in the last bits; so which trace a
        # shape gets depends on the shapes before it, unless every shape gets its own
        # (deterministic: a resumed run then computes what an uninterrupted one did).
        self.accumulate = tf.function(self._accumulate, autograph=False,
                                      reduce_retracing=not run.deterministic)
        self._apply_traced = tf.function(self._apply, autograph=False)
        # One trace of the forward and backward pass for every shape of batch: a caller's
        # trace per shape (above) calls it. XLA needs static shapes: a trace per shape.
        ids = tf.TensorSpec([None, None], tf.int32)
        self.gradients = tf.function(
            self._gradients, autograph=False, jit_compile=run.jit_compile,
            input_signature=None if run.jit_compile else [ids, ids, ids])


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
                    label_smoothing, bias=self.model.embedding.logits_bias())
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

    def apply(self, learning_rate_factor: float = 1.0, budget_spent: bool = False,
              progress: float = 0.0) -> StepStatistics:
        """One update from the accumulated gradients, with one all-reduce, at the
        schedule's learning rate times `learning_rate_factor`; `self.budget_spent` becomes
        `budget_spent`, and with a dropout schedule the rate becomes the schedule's at
        `progress`, the run's after this update (all three the chief's: see the module
        docstring). Returns the step's statistics as tensors (the loop reads them every
        log_every updates)."""
        chief = [tf.constant(learning_rate_factor, tf.float32), tf.constant(float(budget_spent))]
        if self.dropout is not None:
            chief.append(tf.constant(progress, tf.float32))
        return self._apply_traced(*chief)

    def _apply(self, learning_rate_factor: tf.Tensor, budget_spent: tf.Tensor,
               progress: Optional[tf.Tensor] = None) -> StepStatistics:
        """`apply`, traced once: the factor, the flag and the progress are float32 []
        tensors (no progress without a dropout schedule)."""
        chief = [learning_rate_factor, budget_spent] + ([] if progress is None else [progress])

        def reduce_fn():
            context = tf.distribute.get_replica_context()
            chief_only = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
            # The one all-reduce of the update: the totals and the chief's factor, budget
            # flag (and progress) travel with the gradients.
            reduced = context.all_reduce(
                tf.distribute.ReduceOp.SUM,
                [t.read_value() for t in self.totals] + [c * chief_only for c in chief]
                + [g.read_value() for g in self.gradient_sums])
            fields = len(Totals._fields)
            totals = Totals(*reduced[:fields])
            factor, spent = reduced[fields], reduced[fields + 1]
            chief_progress = reduced[fields + 2] if progress is not None else tf.zeros([])
            tokens = tf.maximum(totals.target_tokens, 1.0)
            scale = self._loss_scale()
            grads = [g / (tokens * scale) for g in reduced[fields + len(chief):]]
            for variable in [*self.gradient_sums, *self.totals]:
                variable.assign(tf.zeros_like(variable))
            return grads, (spent > 0.5, chief_progress), StepStatistics(
                loss=totals.loss_sum / tokens, token_accuracy=totals.correct_tokens / tokens,
                target_tokens=totals.target_tokens, source_tokens=totals.source_tokens,
                gradient_norm=tf.linalg.global_norm(grads), loss_scale=scale,
                learning_rate=tf.cast(self.optimizer.learning_rate, tf.float32) * factor)

        grads, (spent, chief_progress), stats = self.strategy.run(reduce_fn)
        spent, chief_progress, stats = tf.nest.map_structure(
            lambda t: self.strategy.experimental_local_results(t)[0],
            (spent, chief_progress, stats))
        self.budget_spent.assign(spent)
        if self.dropout is not None:
            self.dropout.advance(chief_progress)
        self._update(grads, finite=tf.math.is_finite(stats.gradient_norm),
                     learning_rate=stats.learning_rate)
        if self.moving_average is not None:
            self.moving_average.update(
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
