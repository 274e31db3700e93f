"""The training loop: distributed, mixed-precision updates with token-normalised gradient
accumulation, until the step total or the time budget, with checkpoints, validation and
progress at their intervals.

The update itself (accumulation, the all-reduce, Adam, the moving average) is
trainer/training/update.py.
"""

import functools
import time
from typing import Callable, Dict, Optional

import keras
import tensorflow as tf

from keras_transformer import Transformer
from trainer.config import RunConfig
from trainer.data.input_pipeline import Data
from trainer.model_dir.best import BestTracker
from trainer.training import distribute
from trainer.training.checkpointing import Checkpointer
from trainer.training.cooldown import cooldown_factor, run_progress
from trainer.training.preemption import PreemptionWatcher
from trainer.training.progress import TrainingProgress, StepStatistics
from trainer.training.stream import TrainingStream
from trainer.training.update import Updater
from trainer.training.validation import Validator


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss)."""


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
        self.update = Updater(model, optimizer, strategy, run, checkpointer.moving_average,
                              checkpointer.dropout)
        self.stream = None  # TrainingStream, from restore()
        # The best validation (--keep_best) and early stopping's patience, on the chief.
        self.best = (BestTracker(model, run.model_dir, run.keep_best or "bleu",
                                 bool(run.keep_best), run.early_stopping,
                                 run.early_stopping_min_delta, log)
                     if (run.keep_best or run.early_stopping) and validator is not None
                     and self.chief else None)
        self.stopping = False  # early stopping said stop at the last validation
    @property
    def step(self) -> int:
        return self.checkpointer.step

    def restore(self) -> int:
        """Restores the latest checkpoint and positions the training stream after it;
        returns the step."""
        step = self.checkpointer.restore(self.log)
        dropout = self.checkpointer.dropout
        if dropout is not None:  # the larger of the progress kept and this run's
            dropout.advance(run_progress(step, self.run.train_steps))
            self.log(f"dropout {float(dropout.rate.numpy()):g} from step {step} "
                     f"(progress {float(dropout.progress.numpy()):.3f} of "
                     f"{dropout.schedule})")
        self.stream = TrainingStream(self.strategy, self.data, self.run.model_dir,
                                     self.run.keep_checkpoints, self.run.accum_steps, self.log)
        self.stream.restore(step)
        return step

    def save(self, step: int) -> str:
        """Checkpoints `step`: the stream's position first, so a model checkpoint always
        has its stream's (kill -9 between the two leaves the previous pair); returns the
        model checkpoint's path."""
        self.stream.save(step)
        return self.checkpointer.save(step)

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
            self.log(f"resumed from {self.checkpointer.restored} at step {step}")
        if step >= run.train_steps:
            self.log(f"already at step {step} of {run.train_steps}; nothing to train")
            return {}
        deadline = time.time() + 60 * run.max_train_minutes if run.max_train_minutes else None
        progress = TrainingProgress(run.model_dir, run.train_steps, run.log_every, step, deadline,
                               enabled=self.chief)
        save = functools.partial(self._save_on_preemption, progress)
        with PreemptionWatcher(self.strategy, save) as preemption:
            try:
                metrics, stats = self._train_loop(step, progress, deadline, preemption)
            finally:
                progress.close()
        return {**{f"train_{k}": float(v) for k, v in stats._asdict().items()}, **metrics}

    def _train_loop(self, step: int, progress: TrainingProgress, deadline: Optional[float],
                    preemption: PreemptionWatcher):
        """Updates from `step` to run.train_steps or the deadline; returns (validation
        metrics, the last step's statistics). Raises Preempted after a signal."""
        run, metrics = self.run, {}
        budget = 60 * run.max_train_minutes if deadline is not None else None
        while step < run.train_steps:
            for _ in range(run.accum_steps):
                self.update.accumulate(self.stream.next())
            now = time.time()
            elapsed = budget - (deadline - now) if budget else 0.0
            factor = cooldown_factor(run.cooldown, step, run.train_steps, elapsed, budget)
            # Tensors: the host reads only at the intervals below.
            stats = self.update.apply(
                factor, budget_spent=budget is not None and now > deadline,
                progress=run_progress(step + 1, run.train_steps, elapsed, budget))
            step += 1
            # The chief's clock, read by every worker at the same steps (whatever budget
            # each was given).
            out_of_time = step % run.log_every == 0 and bool(self.update.budget_spent.numpy())
            last = step == run.train_steps or out_of_time
            if step % run.log_every == 0 or last:
                self._raise_if_nonfinite(progress)
                progress.update(step, stats, self._tokens_since_read(), self._dropout_rate())
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
            if self.stopping:
                self.log(self.best.stop_line(step))
                if step % run.checkpoint_every and not last:
                    self.save(step)
                break
            if out_of_time:
                break
            preemption.after_update(step, stats)
        return metrics, stats

    def _validate(self, step: int) -> Dict[str, float]:
        """Validation metrics of the weights the export will ship: the moving average
        with export_weights=ema (swapped in for the call), else the live weights; the
        best of them kept (--keep_best), early stopping's patience counted."""
        if self.run.export_weights != "ema":
            return self._scored(step)
        variables = self.model.trainable_variables
        live = [tf.identity(variable) for variable in variables]
        self.checkpointer.moving_average.copy_to(variables)
        try:
            return self._scored(step)
        finally:
            for variable, value in zip(variables, live):
                variable.assign(value)

    def _scored(self, step: int) -> Dict[str, float]:
        """The validator's metrics of the model's weights as they are, given to the best
        tracker while the model holds them."""
        metrics = self.validator(step)
        if self.best is not None:
            self.stopping = self.best.update(step, metrics)
        return metrics

    def _save_on_preemption(self, progress: TrainingProgress, step: int, stats: StepStatistics
                            ) -> str:
        """The checkpoint of a preempted run's last update, logged and checked like any
        other; returns its path."""
        self._raise_if_nonfinite(progress)
        if step % self.run.log_every:
            progress.update(step, stats, self._tokens_since_read(), self._dropout_rate())
        progress.end_line()
        if step % self.run.checkpoint_every == 0:  # written already
            return self.checkpointer.latest
        return self.save(step)

    def _raise_if_nonfinite(self, progress: TrainingProgress):
        """Raises TrainingError naming the first update whose loss was not finite, if any;
        the last checkpoint, written before it, is kept."""
        bad_step = int(self.update.first_nonfinite_step.numpy())
        if bad_step:
            progress.close()
            kept = (f"the last good checkpoint is {self.checkpointer.latest}"
                    if self.checkpointer.latest else "no checkpoint was written before it")
            raise TrainingError(f"non-finite loss at step {bad_step}; stopping: {kept}")

    def _dropout_rate(self) -> Optional[float]:
        """The dropout schedule's rate now (a host read), None without a schedule."""
        dropout = self.checkpointer.dropout
        return None if dropout is None else float(dropout.rate.numpy())

    def _tokens_since_read(self) -> float:
        """Source + target tokens of the updates since the last call (a host read)."""
        tokens = float(self.update.tokens_since_read.numpy())
        self.update.tokens_since_read.assign(0.0)
        return tokens
