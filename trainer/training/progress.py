"""What training shows while it runs: a progress line on the console and the step
statistics in TensorBoard (`<model_dir>/train`), every `log_every` updates."""

import os
import sys
import time
from typing import NamedTuple, Optional, TextIO

import tensorflow as tf


class StepStatistics(NamedTuple):
    """What one update reports (all float32 scalars; token counts over all replicas and
    accumulated microbatches)."""

    loss: tf.Tensor  # label-smoothed cross-entropy per target token
    token_accuracy: tf.Tensor  # argmax == label, per target token
    target_tokens: tf.Tensor
    source_tokens: tf.Tensor
    gradient_norm: tf.Tensor  # of the token-normalised gradient, before Adam
    loss_scale: tf.Tensor  # float16's dynamic loss scale; 1 otherwise
    learning_rate: tf.Tensor


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class TrainingProgress:
    """Reports every `log_every` updates: "step 120/20000  loss 6.78  lr 2.35e-04
    8,748 tok/s  elapsed 2:15  ETA 49:52" and the statistics as TensorBoard scalars
    (the StepStatistics fields and tokens_per_second; with a dropout schedule, its rate
    as "dropout", also on the line).

    On a terminal the line is rewritten in place; in a file it is one line per interval.
    The ETA is the sooner of train_steps at this invocation's pace and the end of the
    wall-time budget.

    Args:
      model_dir: summaries go to <model_dir>/train.
      train_steps, log_every: the run's total and reporting interval, in updates.
      start_step: the step training starts (or resumes) from.
      deadline: time.time() at which the budget ends, or None.
      enabled: False for workers other than the chief, which report nothing.
      stream: where the line goes (default stdout).
    """

    def __init__(self, model_dir: str, train_steps: int, log_every: int, start_step: int,
                 deadline: Optional[float] = None, enabled: bool = True,
                 stream: Optional[TextIO] = None):
        self.train_steps, self.log_every, self.deadline = train_steps, log_every, deadline
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.on_terminal = self.stream.isatty()
        self.writer = (tf.summary.create_file_writer(os.path.join(model_dir, "train"))
                       if enabled else None)
        self.start_time = self.last_time = time.time()
        self.start_step = start_step
        self.line_open = False

    def update(self, step: int, stats: StepStatistics, tokens: float,
               dropout: Optional[float] = None):
        """Reports `step`'s statistics; `tokens` are the source and target tokens of
        the updates since the last report, `dropout` a dropout schedule's rate (None
        without one). The trainer calls it every log_every updates and at the last one."""
        now = time.time()
        tokens_per_second = tokens / max(now - self.last_time, 1e-9)
        self.last_time = now
        if not self.enabled:
            return
        with self.writer.as_default(step=step):
            for name, value in stats._asdict().items():
                tf.summary.scalar(name, float(value))
            tf.summary.scalar("tokens_per_second", tokens_per_second)
            if dropout is not None:
                tf.summary.scalar("dropout", dropout)
        elapsed = now - self.start_time
        line = (f"step {step}/{self.train_steps}  loss {float(stats.loss):.4f}  "
                f"lr {float(stats.learning_rate):.3g}  "
                + (f"dropout {dropout:g}  " if dropout is not None else "")
                + f"{tokens_per_second:,.0f} tok/s  elapsed {_clock(elapsed)}")
        eta = self.eta(step, now)
        if eta is not None:
            line += f"  ETA {_clock(eta)}"
        if self.on_terminal:
            self.stream.write("\r" + line + "\x1b[K")
            self.line_open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def eta(self, step: int, now: float) -> Optional[float]:
        """Seconds left: to train_steps at this invocation's pace, or to the deadline."""
        done = step - self.start_step
        if done <= 0:
            return None
        left = (self.train_steps - step) * (now - self.start_time) / done
        if self.deadline is not None:
            left = min(left, self.deadline - now)
        return left

    def end_line(self):
        """Ends a line rewritten in place, so that other output starts on its own line."""
        if self.line_open:
            self.stream.write("\n")
            self.stream.flush()
            self.line_open = False

    def close(self):
        self.end_line()
        if self.writer is not None:
            self.writer.flush()
